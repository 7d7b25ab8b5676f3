"""Composing the Hydra config outside a run, and turning composition errors into one line.

Keys are checked in one place, ``undeclared``, against every declared key, before Hydra
composes: the command line's, and those that the chosen experiment and sweep files set
(a sweep file's ``hydra.sweeper.params`` included). After composition, ``validate`` checks
the composed config against the schema of the options it chose.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

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
from theseus.config.context import check, mark_checked
from theseus.config.discovery import HOW_TO_DECLARE
from theseus.config.errors import ConfigError, suggest
from theseus.config.fields import MISSING
from theseus.config.schema import schema_of, typed


def compose(overrides: Sequence[str] = (), *, hydra: bool = False) -> DictConfig:
    """The config ``python -m theseus.run OVERRIDES`` would run, validated.

    Raises ConfigError (one line) for an unknown key, a wrong type, a value outside its
    choices or an unknown experiment. ``hydra=True`` keeps the ``hydra`` node.
    """
    registry.load()
    _check_folder_choices(overrides)
    chosen = None if registry.all_loaded() else choices(overrides)
    registry.publish(chosen or {})  # the chosen options imported, the nodes of those imported published
    for key, where in undeclared(overrides, None if chosen is None else registry.schema(chosen)):
        raise unknown_key(key, where, overrides)
    cfg = _hydra(overrides)
    try:
        validate(cfg, overrides)
    except OmegaConfBaseException as exc:  # an interpolation that does not resolve, ...
        raise explain(exc, overrides) from exc
    if not hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    remember(cfg, overrides)  # what theseus.train prints as the command that continues its run
    return cfg


_COMPOSED: dict[int, tuple[weakref.ref, tuple[str, ...], str]] = {}  # id -> (the config, its overrides, its YAML)


def remember(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """Record that ``cfg`` (as it is now) was composed from ``overrides``."""
    key = id(cfg)
    _COMPOSED[key] = (weakref.ref(cfg, lambda _: _COMPOSED.pop(key, None)), tuple(overrides), OmegaConf.to_yaml(cfg))


def composed_from(cfg: DictConfig) -> list[str] | None:
    """The overrides ``compose`` made ``cfg`` from, if it is unchanged since (None: unknown, or changed)."""
    known = _COMPOSED.get(id(cfg))
    if known is None or known[0]() is not cfg or known[2] != OmegaConf.to_yaml(cfg):
        return None
    return list(known[1])


def with_values(cfg: DictConfig, values: Mapping[str, Any]) -> DictConfig:
    """A new config: ``cfg`` with ``values`` (dotted keys) laid over it, ``cfg`` unchanged. What
    a run derives (its vocabulary, ``trainer.init_from``'s architecture) is kept apart from the
    composed config, and laid over it only to configure the run's parts."""
    derived = cfg.copy()
    for key, value in values.items():
        OmegaConf.update(derived, key, value, force_add=True)
    return derived


def _hydra(overrides: Sequence[str]) -> DictConfig:
    """Hydra's composition of ``overrides`` (its ``hydra`` node kept); its errors in one line."""
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name=JOB_NAME):
            return hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
    except HydraException as exc:
        raise explain(exc, overrides) from exc


def choices(overrides: Sequence[str]) -> dict[str, str]:
    """``{group: option}``: the options ``overrides`` choose (with the experiment and sweep files
    they name), known before any option is imported: Hydra composes only the group choices,
    every option published as its ``choices`` record alone."""
    registry.store(placeholders=True)
    picks = [o for o in overrides if o.lstrip("+~").partition("=")[0] in (*registry.groups(), *registry.FOLDERS)]
    return registry.choices_of(_hydra(picks))


JOB_NAME = "run"  # hydra.job.name, as Hydra names a job of theseus/cli/run.py (its log: run.log)


def conf_dir() -> Path:
    """The primary config's folder (``conf/``, shipped with theseus)."""
    return registry.shipped("conf")


def validate(cfg: DictConfig, overrides: Sequence[str] = ()) -> None:
    """Check that every key of ``cfg`` is declared by the options it chose (its ``choices``
    record) and each value against its field, then mark ``cfg`` checked (``configure()`` takes
    its values as they are).

    OmegaConf's schema nodes have typed most values during composition; here the choices are
    checked, and the types OmegaConf cannot express. A key of another option
    (``optimizer.momentum`` with ``optimizer=adamw``), added with ``+`` or written in an
    experiment file, is refused here.
    """
    schema = registry.chosen_schema(cfg)
    for key in _leaves(cfg, schema):
        raise unknown_key(key, origin(key, overrides), overrides, registry.choices_of(cfg))
    for key, spec in schema.items():
        value = OmegaConf.select(cfg, key, default=MISSING, throw_on_missing=False)
        if value is not MISSING and value != "???" and not OmegaConf.is_missing(cfg, key):
            try:
                check(spec, OmegaConf.to_object(value) if OmegaConf.is_config(value) else value, typed=typed(spec))
            except ConfigError as exc:
                raise ConfigError(f"{origin(key, overrides)}{exc}") from exc
    mark_checked(cfg)


NOT_KEYS = ("hydra", registry.RECORD)  # top-level entries of a composed config that no field declares


def _leaves(cfg: DictConfig | Mapping, schema: Mapping, prefix: str = ""):
    """The dotted keys of ``cfg`` that no field in ``schema`` declares (a declared key's own
    contents, such as a dict's entries, are its value, not keys). Interpolations stay unresolved."""
    tree = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
    for name, node in tree.items():
        key = f"{prefix}{name}"
        if key in schema or (not prefix and name in NOT_KEYS):
            continue
        if not _is_prefix(key, schema):
            yield key
        elif isinstance(node, Mapping):
            yield from _leaves(node, schema, f"{key}.")
        else:
            yield key  # a value where the schema has a group: architecture=3


def _is_prefix(key: str, schema: Mapping) -> bool:
    return any(known.startswith(f"{key}.") for known in schema)


def undeclared(overrides: Sequence[str], chosen: Mapping | None = None) -> Iterator[tuple[str, str]]:
    """``(key, where)`` for every key that no option declares, set by ``overrides``: on the
    command line (``where`` empty), or in the experiment and sweep files they choose
    (``where``: ``in PATH: ``), a sweep file's ``hydra.sweeper.params`` included.

    ``chosen``: the schema of the options chosen; a key it lacks is looked for among every
    option's (imported then: only a mistake imports the options not chosen).
    Group choices (``model=gpt``), Hydra's own settings and what its parser reports are not keys.
    """
    for key, where in _undeclared(overrides, chosen if chosen is not None else registry.every_key()):
        if chosen is None or not _declared(key, registry.every_key()):
            yield key, where


def _undeclared(overrides: Sequence[str], known: Mapping) -> Iterator[tuple[str, str]]:
    for override in overrides:
        if override.startswith("-") or "=" not in override and not override.startswith("~"):
            continue
        key = override.lstrip("+~").partition("=")[0]
        if (not key or key in (*registry.groups(), *registry.FOLDERS) or key.split(".")[0] == "hydra"
                or any(c in key for c in "/@${}[]()'\" ,")):
            continue
        if not _declared(key, known):
            yield key, ""
    for path in chosen_files(overrides):
        node = OmegaConf.load(path)
        where = f"in {path}: "
        body = OmegaConf.create({name: value for name, value in node.items() if name not in ("defaults", "hydra")})
        yield from ((key, where) for key in _leaves(body, known))
        params = OmegaConf.select(node, "hydra.sweeper.params", default=None) or {}
        yield from ((str(key), where) for key in params if not _declared(str(key), known))


def chosen_files(overrides: Sequence[str]) -> list[Path]:
    """The experiment and sweep files that ``+experiment=A,B`` / ``+sweep=NAME`` choose."""
    return [path for _, path in _chosen(overrides)]


def _chosen(overrides: Sequence[str]) -> list[tuple[str, Path]]:
    """``[("+experiment=gpt_small", PATH), ...]``: each file chosen, as the command line chose it."""
    files = []
    for override in overrides:
        group, _, names = override.lstrip("+~").partition("=")
        if group in registry.FOLDERS:
            available = registry.folder_options(group)
            files += [(f"+{group}={name}", available[name]) for name in names.split(",") if name in available]
    return files


def origin(key: str, overrides: Sequence[str]) -> str:
    """``in PATH: `` when a chosen experiment or sweep file sets ``key`` and the command line
    does not, else empty."""
    setting = _file_setting(key, overrides)
    return f"in {setting[1]}: " if setting else ""


def _file_setting(key: str, overrides: Sequence[str]) -> tuple[str, Path, Any] | None:
    """``("+experiment=gpt_small", PATH, 6)``: the chosen file that sets ``key`` (the command line
    not setting it) and its value; None where none does."""
    if any(override.lstrip("+~").partition("=")[0] == key for override in overrides):
        return None
    for chosen, path in _chosen(overrides):
        value = OmegaConf.select(OmegaConf.load(path), key, default=None)
        if value is not None:
            return chosen, path, OmegaConf.to_object(value) if OmegaConf.is_config(value) else value
    return None


def _declared(key: str, schema: Mapping) -> bool:
    """``key`` is a declared key, a group of them, or inside a declared (dict) value."""
    parts = key.split(".")
    return _is_prefix(key, schema) or any(".".join(parts[:i]) in schema for i in range(1, len(parts) + 1))


GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def explain(exc: BaseException, overrides: Sequence[str] = ()) -> ConfigError:
    """A Hydra/OmegaConf composition error as one line naming the key and the fix.

    Read from the exception's type and attributes (the key it names), not from its message.
    """
    if isinstance(exc, MissingConfigException) and exc.options is not None:
        group, _, name = (exc.missing_cfg_file or "").rpartition("/")
        hint = f"; to add yours, {HOW_TO_DECLARE}" if group in registry.groups() else ""
        return ConfigError(f"unknown {group} {name!r}; available: {', '.join(sorted(exc.options))} "
                           f"(set {group}=NAME){hint}")
    if isinstance(exc, OverrideParseException):
        key, _, value = exc.override.lstrip("+~").partition("=")
        if value.startswith("~"):  # the shell expands ~ only at the start of a word, not after KEY=
            return ConfigError(f"override {exc.override!r}: write $HOME instead of ~ ({key}=$HOME{value[1:]}); "
                               "the shell does not expand ~ after KEY=")
        return ConfigError(f"override {exc.override!r} of {key} does not parse: write KEY=VALUE, quoting a value "
                           f"with special characters, e.g. {key}='...', and give comma-separated values only with "
                           f"--multirun (see {GRAMMAR})")
    cause = _omegaconf_cause(exc)
    key = getattr(cause, "full_key", None)
    where = origin(key, overrides) if key else ""
    if isinstance(cause, ConfigTypeError) and key and "deletion" in str(cause):
        spec = registry.every_key().get(key)
        detail = f" ({spec.describe()})" if spec else ""
        return ConfigError(f"~{key}: a declared key cannot be deleted; set it instead, e.g. {key}=VALUE{detail}")
    if isinstance(cause, InterpolationResolutionError) and key:
        return ConfigError(f"{where}{key}: {str(cause).splitlines()[0]}: an interpolation must name a declared "
                           "key, e.g. ${architecture.d_model}")
    if isinstance(cause, ConfigKeyError | AttributeError) and key:
        return unknown_key(key, where, overrides)
    if isinstance(cause, ConfigTypeError) and not key:  # a value of another shape ({a: 1} for a list)
        key = next((o.lstrip("+~").partition("=")[0] for o in overrides if f"override {o}" in str(exc)), None)
    if isinstance(cause, ValidationError | ConfigTypeError) and key:
        spec = registry.every_key().get(key)
        detail = f" ({spec.describe()})" if spec else ""
        if spec and not spec.required and spec.default is not None:
            detail += f": give one, e.g. {key}={_cli(spec.default)}"
        return ConfigError(f"{where}{key}: {str(cause).splitlines()[0]}{detail}")
    return ConfigError(" ".join(str(exc).split()))


def unknown_key(key: str, where: str = "", overrides: Sequence[str] = (),
                chosen: Mapping[str, str] | None = None) -> ConfigError:
    """``unknown config key 'x'; did you mean y (int, default 1: help)?`` (``where``: a prefix
    naming the file it was found in; with ``overrides``, the value a file they choose gives y:
    ``int, default 12, +experiment=gpt_small sets 6: ...``); for a key (or a node: ``dpo``) that an
    option not chosen declares, which option it applies to (``chosen``: the options chosen, else
    those of ``overrides``)."""
    known = registry.every_key()
    group = key.split(".")[0]
    if key in known and group in registry.groups():  # declared, by options of its group not chosen
        owners = [name for name, cls in registry.options(group).items() if key in schema_of(cls)]
        return ConfigError(f"{where}{key} does not apply to the {group} chosen; it is a key of "
                           f"{', '.join(f'{group}={name}' for name in owners)}: choose one of those or drop the key")
    models = _owners("model", key)
    if models:  # a key (or a node: architecture.moe) of another model than the one chosen
        return ConfigError(f"{where}{key} is a key of {', '.join(f'model={name}' for name in models)}, not of the "
                           f"model chosen: choose {'one of those' if len(models) > 1 else f'model={models[0]}'} "
                           f"or drop the key")
    for other in registry.groups():  # a key of another group's option: dpo.beta is task=dpo's
        owners = _owners(other, key)
        if owners:
            given = next((o.lstrip("+~").partition("=")[0] for o in overrides
                          if o.lstrip("+~").partition("=")[0].startswith(f"{key}.")),
                         key if key in known else f"{key}.*")
            here = (chosen if chosen is not None else _chosen_by(overrides)).get(other)
            options = " or ".join(f"{other}={name}" for name in owners)
            return ConfigError(f"{where}{given} applies to {options} only ({other}={here} here): drop it or set "
                               f"{options if len(owners) == 1 else f'one of {options}'}")
    close = suggest(key, known)
    if not close:
        return ConfigError(f"{where}unknown config key {key!r}; `python -m theseus.config` lists every key (a key "
                           f"of your own module appears once you {HOW_TO_DECLARE})")
    best, others = close[0], close[1:]
    also = f" (also close: {', '.join(others)})" if others else ""
    setting = _file_setting(best, overrides)
    described = known[best].describe(f"{setting[0]} sets {_cli(setting[2])}" if setting else "")
    return ConfigError(f"{where}unknown config key {key!r}; did you mean {best} ({described})?{also}")


def _owners(group: str, key: str) -> list[str]:
    """The options of ``group`` that declare ``key``, or keys under it (a node)."""
    return [name for name, cls in registry.options(group).items()
            if any(k == key or k.startswith(f"{key}.") for k in schema_of(cls))]


def _chosen_by(overrides: Sequence[str]) -> dict[str, str]:
    """``choices(overrides)``, Hydra's store published again as it was (every imported option's node)."""
    try:
        return choices(overrides)
    finally:
        registry.publish({})


def _cli(value) -> str:
    """``value`` as a command-line override writes it: true, null, [a, b], 3e-4."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(_cli, value)) + "]"
    return str(value)


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
