"""Composing the Hydra config outside a run, and turning composition errors into one line."""

from __future__ import annotations

from collections.abc import Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from theseus.config import registry
from theseus.config.context import check
from theseus.config.errors import ConfigError, suggest
from theseus.config.fields import MISSING

CONF = registry.ROOT / "conf"


def compose(overrides: Sequence[str] = (), *, hydra: bool = False) -> DictConfig:
    """The config ``python -m theseus.run OVERRIDES`` would run, validated.

    Raises ConfigError (one line) for an unknown key, a wrong type, a value outside its
    choices or an unknown experiment. ``hydra=True`` keeps the ``hydra`` node.
    """
    registry.load_builtins()
    registry.store()
    _check_folder_choices(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
    except HydraException as exc:
        raise explain(exc) from exc
    validate(cfg)
    if not hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def validate(cfg: DictConfig) -> None:
    """Check every declared key's value against its field (type and choices)."""
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices) if "hydra" in cfg else None
    for key, spec in registry.schema(choices).items():
        value = OmegaConf.select(cfg, key, default=MISSING, throw_on_missing=False)
        if value is not MISSING and value != "???" and not OmegaConf.is_missing(cfg, key):
            check(spec, OmegaConf.to_object(value) if OmegaConf.is_config(value) else value)


def explain(exc: BaseException) -> ConfigError:
    """A Hydra/OmegaConf composition error as one line naming the key and the fix."""
    if isinstance(exc, MissingConfigException) and exc.options is not None:
        group = (exc.missing_cfg_file or "").split("/")[0]
        name = (exc.missing_cfg_file or "").split("/")[-1]
        return ConfigError(f"unknown {group} {name!r}; available: {', '.join(sorted(exc.options))}")
    cause = _omegaconf_cause(exc)
    key = getattr(cause, "full_key", None)
    if isinstance(cause, ConfigKeyError | AttributeError) and key:
        return unknown_key(key)
    if isinstance(cause, ValidationError) and key:
        spec = registry.every_key().get(key)
        detail = f" ({spec.describe()})" if spec else ""
        return ConfigError(f"{key}: {str(cause).splitlines()[0]}{detail}")
    return ConfigError(" ".join(str(exc).split()))


def unknown_key(key: str) -> ConfigError:
    """``unknown config key 'x'; did you mean y (int, default 1: help)?``"""
    known = registry.every_key()
    close = suggest(key, known)
    if not close:
        return ConfigError(f"unknown config key {key!r}; `python -m theseus.config` lists every key")
    best, others = close[0], close[1:]
    also = f" (also close: {', '.join(others)})" if others else ""
    return ConfigError(f"unknown config key {key!r}; did you mean {best} ({known[best].describe()})?{also}")


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


def _omegaconf_cause(exc: BaseException) -> BaseException | None:
    while exc is not None:
        if isinstance(exc, OmegaConfBaseException):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
