"""The registry of configurable roots, and its publication as Hydra config groups.

Each registered class becomes an option of its group (``model``, ``optimizer``, ...) whose
node is the schema derived from the class's components() tree; experiment and sweep files
become the ``experiment`` and ``sweep`` groups. Nothing here is written in YAML twice.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from theseus.config.errors import ConfigError
from theseus.config.schema import Schema, schema_of, structured

GROUPS = ("model", "optimizer", "data", "trainer", "mesh", "distributed", "logger", "evaluation")

# The modules whose import registers theseus's own options.
BUILTINS = (
    "theseus.model.models",
    "theseus.model.fit",
    "theseus.base.mesh",
    "theseus.base.distributed",
    "theseus.data.config",
    "theseus.training.optimizer",
    "theseus.training.config",
    "theseus.training.logger",
    "theseus.tasks.evaluation",
)

ROOT = Path(__file__).resolve().parents[2]  # the checkout: conf/, experiments/, sweeps/
FOLDERS = {"experiment": "experiments", "sweep": "sweeps"}

_OPTIONS: dict[str, dict[str, type]] = {group: {} for group in GROUPS}


def register(group: str, name: str):
    """Class decorator: make ``cls`` the option ``name`` of config group ``group``."""
    if group not in _OPTIONS:
        raise ValueError(f"unknown config group {group!r}; groups are {', '.join(GROUPS)}")

    def decorate(cls: type) -> type:
        taken = _OPTIONS[group].get(name)
        if taken is not None and taken.__qualname__ != cls.__qualname__:
            raise ValueError(f"{group}={name} is already registered to {taken.__qualname__}")
        _OPTIONS[group][name] = cls
        return cls

    return decorate


def model_class(cfg) -> type:
    """The registered model class a composed config chose (its ``model`` key)."""
    name = cfg.get("model")
    if name not in _OPTIONS["model"]:
        raise ConfigError(f"unknown model {name!r}; available: {', '.join(_OPTIONS['model'])}")
    return _OPTIONS["model"][name]


def options(group: str) -> dict[str, type]:
    """The registered options of ``group``: name -> root class."""
    return dict(_OPTIONS[group])


def load_builtins() -> None:
    """Import theseus's own components so that they register."""
    for module in BUILTINS:
        importlib.import_module(module)


def schema(choices: dict[str, str] | None = None) -> Schema:
    """The schema of one choice per group (the first registered where ``choices`` is silent)."""
    roots = []
    for group, opts in _OPTIONS.items():
        name = (choices or {}).get(group) or next(iter(opts), None)
        if name in opts:
            roots.append(opts[name])
    return schema_of(*roots)


def every_key() -> Schema:
    """Every key any option declares (for suggestions when a key is misspelt)."""
    merged: Schema = {}
    for opts in _OPTIONS.values():
        for cls in opts.values():
            for key, spec in schema_of(cls).items():
                merged.setdefault(key, spec)
    return merged


def folder_options(group: str) -> dict[str, Path]:
    """The YAML files of ``experiment`` or ``sweep``: the checkout's folder, then ./ (wins)."""
    found = {}
    for base in (ROOT, Path.cwd()):
        for path in sorted((base / FOLDERS[group]).glob("*.yaml")):
            found[path.stem] = path
    return found


def store() -> None:
    """Publish every option to Hydra's ConfigStore (package ``_global_``: keys as declared)."""
    cs = ConfigStore.instance()
    for group, opts in _OPTIONS.items():
        for name, cls in opts.items():
            node = structured(schema_of(cls))
            if group == "model":  # the choice itself, so a composed config names its model
                node.model = name
            cs.store(group=group, name=name, node=node, package="_global_")
    for group in FOLDERS:
        for name, path in folder_options(group).items():
            try:
                node = OmegaConf.load(path)
            except Exception as exc:  # reported when chosen: an unused broken file stops nothing
                first = " ".join(str(exc).split("\n")[0].split())
                _BROKEN[(group, name)] = (f"{path} does not parse as YAML ({first}): fix the file "
                                          f"(or choose another {group})")
                continue
            _BROKEN.pop((group, name), None)
            cs.store(group=group, name=name, node=node, package="_global_")


_BROKEN: dict[tuple[str, str], str] = {}  # (experiment or sweep, name) -> why its file does not load


def broken(group: str, name: str) -> str | None:
    """Why the ``group`` file ``name`` (experiment or sweep) did not load; None when it did."""
    return _BROKEN.get((group, name))
