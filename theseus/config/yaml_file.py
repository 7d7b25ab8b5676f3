"""A YAML file a run wrote (``.hydra/config.yaml``, ``overrides.yaml``), read back, or one line
naming the file when it is not what a run writes (a half-written or hand-edited file)."""

from __future__ import annotations

from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from theseus.config.errors import ConfigError


def load_yaml(path: Path, kind: type = DictConfig) -> DictConfig | ListConfig:
    """``path``'s YAML as OmegaConf's ``kind`` (a mapping: DictConfig; a list: ListConfig);
    ConfigError naming the file, its line and what to do when it does not parse or is not one."""
    try:
        cfg = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', None) or 'unreadable'}; "
                          f"it is the run's saved config: repair it, or remove the run") from None
    if not isinstance(cfg, kind):
        raise ConfigError(f"{path} holds {type(cfg).__name__.removesuffix('Config').lower() or 'nothing'}, not the "
                          f"{'mapping' if kind is DictConfig else 'list'} a run writes: repair it, or remove the run")
    return cfg
