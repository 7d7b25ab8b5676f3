"""Composing the Hydra config outside a run, and turning composition errors into one line."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import (
    ConfigKeyError,
    ConfigTypeError,
    InterpolationResolutionError,
    OmegaConfBaseException,
    ValidationError,
)

from theseus.config import registry
from theseus.config.context import check
from theseus.config.errors import ConfigError, suggest
from theseus.config.fields import MISSING
from theseus.config.schema import schema_of

CONF = registry.ROOT / "conf"


def compose(overrides: Sequence[str] = (), *, hydra: bool = False) -> DictConfig:
    """The config ``python -m theseus.run OVERRIDES`` would run, validated.

    Raises ConfigError (one line) for an unknown key, a wrong type, a value outside its
    choices or an unknown experiment. ``hydra=True`` keeps the ``hydra`` node.
    """
    registry.load_builtins()
    registry.store()
    _check_folder_choices(overrides)
    _check_override_keys(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
    except HydraException as exc:
        raise explain(exc) from exc
    try:
        validate(cfg)
    except OmegaConfBaseException as exc:  # an interpolation that does not resolve, ...
        raise explain(exc) from exc
    if not hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def validate(cfg: DictConfig) -> None:
    """Check that every key is declared, and every declared key's value against its field
    (type and choices).

    Hydra adds an undeclared key given with ``+`` (``+trainer.max_stepz=5``) or written in an
    experiment file under a plain group without complaint: it is refused here.
    """
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices) if "hydra" in cfg else None
    schema = registry.schema(choices)
    for key in _leaves(cfg, schema):
        raise unknown_key(key)
    for key, spec in schema.items():
        value = OmegaConf.select(cfg, key, default=MISSING, throw_on_missing=False)
        if value is not MISSING and value != "???" and not OmegaConf.is_missing(cfg, key):
            check(spec, OmegaConf.to_object(value) if OmegaConf.is_config(value) else value)


NOT_KEYS = ("hydra", "model")  # top-level entries of a composed config that no field declares


def _leaves(cfg: DictConfig, schema: Mapping, prefix: str = ""):
    """The dotted keys of ``cfg`` that no field in ``schema`` declares (a declared key's own
    contents, such as a dict's entries, are its value, not keys)."""
    for name in cfg:
        key = f"{prefix}{name}"
        if key in schema or (not prefix and name in NOT_KEYS):
            continue
        node = cfg._get_node(name)
        if not _is_prefix(key, schema):
            yield key
        elif OmegaConf.is_dict(node):
            yield from _leaves(node, schema, f"{key}.")
        else:
            yield key  # a value where the schema has a group: architecture=3


def _is_prefix(key: str, schema: Mapping) -> bool:
    return any(known.startswith(f"{key}.") for known in schema)


def _declared(key: str, schema: Mapping) -> bool:
    """``key`` is a declared key, a group of them, or inside a declared (dict) value."""
    parts = key.split(".")
    return _is_prefix(key, schema) or any(".".join(parts[:i]) in schema for i in range(1, len(parts) + 1))


GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def explain(exc: BaseException) -> ConfigError:
    """A Hydra/OmegaConf composition error as one line naming the key and the fix."""
    if isinstance(exc, MissingConfigException) and exc.options is not None:
        group = (exc.missing_cfg_file or "").split("/")[0]
        name = (exc.missing_cfg_file or "").split("/")[-1]
        return ConfigError(f"unknown {group} {name!r}; available: {', '.join(sorted(exc.options))} "
                           f"(set {group}=NAME)")
    if isinstance(exc, OverrideParseException):
        reason = " ".join(exc.message.split()).split(" See https://")[0]
        reason = reason.replace(f"Error parsing override '{exc.override}' ", "")
        reason = reason.split(" expecting {")[0]  # the grammar's whole token list says nothing
        key = exc.override.lstrip("+~").partition("=")[0]
        return ConfigError(f"override {exc.override!r} of {key} does not parse ({reason}): write KEY=VALUE, "
                           f"quoting a value with special characters, e.g. {key}='...' (see {GRAMMAR})")
    where = _file_of(str(exc))
    cause = _omegaconf_cause(exc)
    key = getattr(cause, "full_key", None)
    deleted = re.search(r"Could not delete from config\. '(.+?)' does not exist", str(exc))
    if deleted:
        return unknown_key(deleted.group(1), where)
    if isinstance(cause, ConfigTypeError) and key and "deletion" in str(cause):
        spec = registry.every_key().get(key)
        detail = f" ({spec.describe()})" if spec else ""
        return ConfigError(f"~{key}: a declared key cannot be deleted; set it instead, e.g. {key}=VALUE{detail}")
    if isinstance(cause, InterpolationResolutionError) and key:
        return ConfigError(f"{where}{key}: {str(cause).splitlines()[0]}: an interpolation must name a declared "
                           "key, e.g. ${architecture.d_model}")
    if isinstance(cause, ConfigKeyError | AttributeError) and key:
        return unknown_key(key, where)
    if isinstance(cause, ValidationError) and key:
        spec = registry.every_key().get(key)
        detail = f" ({spec.describe()})" if spec else ""
        if spec and not spec.required and spec.default is not None:
            detail += f": give one, e.g. {key}={_cli(spec.default)}"
        return ConfigError(f"{where}{key}: {str(cause).splitlines()[0]}{detail}")
    return ConfigError(where + " ".join(str(exc).split()))


def unknown_key(key: str, where: str = "") -> ConfigError:
    """``unknown config key 'x'; did you mean y (int, default 1: help)?`` (``where``: a prefix
    naming the file it was found in)."""
    known = registry.every_key()
    group = key.split(".")[0]
    if key in known and group in registry.GROUPS:  # declared, by options of its group not chosen
        owners = [name for name, cls in registry.options(group).items() if key in schema_of(cls)]
        return ConfigError(f"{where}{key} does not apply to the {group} chosen; it is a key of "
                           f"{', '.join(f'{group}={name}' for name in owners)}: choose one of those or drop the key")
    close = suggest(key, known)
    if not close:
        return ConfigError(f"{where}unknown config key {key!r}; `python -m theseus.config` lists every key")
    best, others = close[0], close[1:]
    also = f" (also close: {', '.join(others)})" if others else ""
    return ConfigError(f"{where}unknown config key {key!r}; did you mean {best} ({known[best].describe()})?{also}")


def _check_override_keys(overrides: Sequence[str]) -> None:
    """Each ``key=value`` override names a declared key (checked before Hydra, which reports a
    misspelt group as the group alone: ``architectur``, not ``architectur.n_layers``)."""
    known = registry.every_key()
    for override in overrides:
        if override.startswith("-") or "=" not in override and not override.startswith("~"):
            continue
        key = override.lstrip("+~").partition("=")[0]
        if (not key or key in (*registry.GROUPS, *registry.FOLDERS) or key.split(".")[0] == "hydra"
                or any(c in key for c in "/@${}[]()'\" ,")):
            continue  # Hydra's own settings, group choices, and what its parser reports
        if not _declared(key, known):
            raise unknown_key(key)


def _cli(value) -> str:
    """``value`` as a command-line override writes it: true, null, [a, b], 3e-4."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(_cli, value)) + "]"
    return str(value)


def _file_of(message: str) -> str:
    """``in experiments/NAME.yaml: `` when Hydra says the error is in a folder option's file."""
    found = re.match(r"In '(\w+)/([^']+)'", message)
    if not found or found.group(1) not in registry.FOLDERS:
        return ""
    path = registry.folder_options(found.group(1)).get(found.group(2))
    return f"in {path}: " if path else ""


def _check_folder_choices(overrides: Sequence[str]) -> None:
    """``+experiment=NAME`` / ``+sweep=NAME`` must name a file (Hydra would take an unknown
    group for a new key)."""
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key in registry.FOLDERS:
            available = registry.folder_options(key)
            for name in value.split(","):
                if name not in available:
                    names = ", ".join(available) or "(none)"
                    raise ConfigError(f"unknown {key} {name!r}; available: {names} (files in {registry.FOLDERS[key]}/)")
                if registry.broken(key, name):
                    raise ConfigError(registry.broken(key, name))


def _omegaconf_cause(exc: BaseException) -> BaseException | None:
    while exc is not None:
        if isinstance(exc, OmegaConfBaseException):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
