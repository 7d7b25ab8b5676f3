"""The registry of configurable roots, and its publication as Hydra config groups.

Each registered class becomes an option of its group (``model``, ``optimizer``, ...) whose
node is the schema derived from the class's components() tree; experiment and sweep files
become the ``experiment`` and ``sweep`` groups. Nothing here is written in YAML twice.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from theseus.config.context import configuration, configure
from theseus.config.discovery import HOW_TO_DECLARE, Project, find_project, load_modules
from theseus.config.errors import ConfigError
from theseus.config.schema import Schema, schema_of, structured

FOLDERS = {"experiment": "experiments", "sweep": "sweeps"}  # +experiment=NAME: experiments/NAME.yaml

_OPTIONS: dict[str, dict[str, type]] = {}  # group -> option name -> root class, in registration order


def shipped(folder: str) -> Path:
    """A folder that ships with theseus (``conf``, ``experiments``, ``sweeps``): inside the
    installed package (a wheel), else beside it (a source checkout)."""
    inside = resources.files("theseus") / folder
    if inside.is_dir():
        return Path(str(inside))
    return Path(__file__).resolve().parents[2] / folder


def register(group: str, name: str):
    """Class decorator: make ``cls`` the option ``name`` of config group ``group``."""
    if not group.isidentifier() or group in FOLDERS or group == "hydra":
        raise ValueError(f"config group {group!r} must be an identifier other than hydra, experiment and sweep")

    def decorate(cls: type) -> type:
        options = _OPTIONS.setdefault(group, {})
        taken = options.get(name)
        if taken is not None and taken.__qualname__ != cls.__qualname__:
            raise ValueError(f"{group}={name} is already registered to {taken.__module__}.{taken.__qualname__}")
        options[name] = cls
        return cls

    return decorate


def model_class(cfg) -> type:
    """The registered model class a composed config chose (its ``model`` key)."""
    name = cfg.get("model")
    models = options("model")
    if name not in models:
        raise ConfigError(f"unknown model {name!r}; available: {', '.join(models)}; to add yours, {HOW_TO_DECLARE}")
    return models[name]


def build_model(cfg, **kwargs):
    """The model a composed config chose, configured from it (``kwargs`` win: e.g. ``vocab_size``,
    which a run takes from its tokenizer). A Flax module, to ``init`` and ``apply`` as any other."""
    with configuration(cfg):
        return configure(model_class(cfg), **kwargs)


def groups() -> tuple[str, ...]:
    """The config groups that options were registered to, in registration order."""
    return tuple(_OPTIONS)


def options(group: str) -> dict[str, type]:
    """The registered options of ``group``: name -> root class."""
    return dict(_OPTIONS.get(group, {}))


def load() -> Project | None:
    """Import every module that registers options: theseus's own and the user's (see
    ``theseus.config.discovery``). Returns the user's project folder, if any."""
    return load_modules()


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
    """The YAML files of ``experiment`` or ``sweep``: the shipped ones, then the project
    folder's, then the working directory's (a later one of the same name wins)."""
    project = find_project()
    found = {}
    for folder in dict.fromkeys((shipped(FOLDERS[group]), *([project.root / FOLDERS[group]] if project else []),
                                 Path.cwd() / FOLDERS[group])):
        for path in sorted(folder.glob("*.yaml")):
            found[path.stem] = path
    return found


def store() -> None:
    """Publish every option to Hydra's ConfigStore (package ``_global_``: keys as declared)."""
    cs = ConfigStore.instance()
    for group, opts in _OPTIONS.items():
        for name, cls in opts.items():
            node = structured(schema_of(cls))
            if group in ("model", "task"):  # the choice itself, so a composed config names its model and task
                node[group] = name
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
