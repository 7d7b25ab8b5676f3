"""The registry of configurable roots, and its publication as Hydra config groups.

Each registered class becomes an option of its group (``model``, ``optimizer``, ...) whose
node is the schema derived from the class's components() tree; experiment and sweep files
become the ``experiment`` and ``sweep`` groups. Nothing here is written in YAML twice.

An option is registered by its class (``@register``) or declared by where its class lives
(``declare``, ``"module:attr"``), imported only when a config chooses it (or when every option
is listed): a run imports the options it runs, no others.

Which option a composed config chose is recorded in the config itself, under ``choices``
(``choices.model: gpt``, one entry per group: each option's node carries its own), and read
with ``chosen(cfg, group)``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, open_dict

from theseus.config.context import Snapshot, configuration, configure
from theseus.config.discovery import HOW_TO_DECLARE, Project, find_project, load_modules
from theseus.config.errors import ConfigError
from theseus.config.schema import Schema, schema_of, structured
from theseus.config.yaml_file import load_yaml

FOLDERS = {"experiment": "experiments", "sweep": "sweeps"}  # +experiment=NAME: experiments/NAME.yaml
RECORD = "choices"  # the top-level node of a composed config naming the option chosen in each group

# group -> option name -> root class, or "module:attr" until imported; in registration order
_OPTIONS: dict[str, dict[str, type | str]] = {}


def shipped(folder: str) -> Path:
    """A folder that ships with theseus (``conf``, ``experiments``, ``sweeps``): inside the
    installed package (a wheel), else beside it (a source checkout)."""
    inside = resources.files("theseus") / folder
    if inside.is_dir():
        return Path(str(inside))
    return Path(__file__).resolve().parents[2] / folder


def _check_group(group: str) -> None:
    if not group.isidentifier() or group in FOLDERS or group in ("hydra", RECORD):
        raise ValueError(f"config group {group!r} must be an identifier other than hydra, {RECORD}, experiment "
                         f"and sweep")


def _where(entry: type | str) -> str:
    return entry.replace(":", ".") if isinstance(entry, str) else f"{entry.__module__}.{entry.__qualname__}"


def _qualname(entry: type | str) -> str:
    return entry.partition(":")[2] if isinstance(entry, str) else entry.__qualname__


def register(group: str, name: str):
    """Class decorator: make ``cls`` the option ``name`` of config group ``group``."""
    _check_group(group)

    def decorate(cls: type) -> type:
        options = _OPTIONS.setdefault(group, {})
        taken = options.get(name)
        if taken is not None and _qualname(taken) != cls.__qualname__:
            raise ValueError(f"{group}={name} is already registered to {_where(taken)}")
        options[name] = cls
        return cls

    return decorate


def declare(group: str, name: str, where: str) -> None:
    """Make the class at ``where`` (``"package.module:Class"``) the option ``name`` of ``group``,
    imported when first asked for (a class registered under that name already stays)."""
    _check_group(group)
    _OPTIONS.setdefault(group, {}).setdefault(name, where)


def option(group: str, name: str) -> type:
    """The class of option ``name`` of ``group``, imported on first use."""
    entry = _OPTIONS[group][name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = _OPTIONS[group][name] = getattr(importlib.import_module(module), attr)
    return entry


def names(group: str) -> tuple[str, ...]:
    """The option names of ``group``, in registration order (nothing imported)."""
    return tuple(_OPTIONS.get(group, {}))


def all_loaded() -> bool:
    """Whether every registered option is imported already."""
    return all(isinstance(entry, type) for opts in _OPTIONS.values() for entry in opts.values())


def name_of(group: str, cls: type) -> str:
    """The name ``cls`` is registered under in ``group``."""
    for name, entry in _OPTIONS.get(group, {}).items():
        if entry is cls or entry == f"{cls.__module__}:{cls.__qualname__}":
            return name
    raise KeyError(f"{_where(cls)} is not an option of {group}")


@functools.cache
def primary_defaults() -> dict[str, str]:
    """The option each group chooses in the primary config (``conf/config.yaml``)."""
    entries = OmegaConf.load(shipped("conf") / "config.yaml").get("defaults", [])
    return {group: str(name) for entry in entries if OmegaConf.is_dict(entry) for group, name in entry.items()}


def chosen(cfg: Any, group: str) -> str:
    """The option of ``group`` that the config ``cfg`` chose: its ``choices`` record; where it has
    none (a config written by hand), the primary config's default, else the first registered."""
    record = cfg.get(RECORD) if isinstance(cfg, Mapping | Snapshot) else None  # a Snapshot's: MISSING when absent
    name = record.get(group) if isinstance(record, Mapping) else None
    if name is None:
        name = primary_defaults().get(group) or next(iter(names(group)), None)
    return name


def chosen_class(cfg: Any, group: str) -> type:
    """The registered class of the option of ``group`` that ``cfg`` chose (imported now)."""
    name = chosen(cfg, group)
    if name not in _OPTIONS.get(group, {}):
        raise ConfigError(f"unknown {group} {name!r}; available: {', '.join(names(group))} (set {group}=NAME); "
                          f"to add yours, {HOW_TO_DECLARE}")
    return option(group, name)


def choices_of(cfg: Any) -> dict[str, str]:
    """``{group: option}`` for every group: the options ``cfg`` chose."""
    return {group: chosen(cfg, group) for group in groups()}


def model_class(cfg) -> type:
    """The registered model class a composed config chose."""
    return chosen_class(cfg, "model")


def build_model(cfg, **kwargs):
    """The model a composed config chose, configured from it (``kwargs`` win: e.g. ``vocab_size``,
    which a run takes from its tokenizer). A Flax module, to ``init`` and ``apply`` as any other."""
    with configuration(cfg):
        return configure(model_class(cfg), **kwargs)


def groups() -> tuple[str, ...]:
    """The config groups that options were registered to, in registration order."""
    return tuple(_OPTIONS)


def options(group: str) -> dict[str, type]:
    """The registered options of ``group``: name -> root class (every one imported)."""
    return {name: option(group, name) for name in names(group)}


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
            roots.append(option(group, name))
    return schema_of(*roots)


def chosen_schema(cfg: Any) -> Schema:
    """The schema of the options the config ``cfg`` chose."""
    return schema(choices_of(cfg))


def every_key() -> Schema:
    """Every key any option declares (for suggestions when a key is misspelt): imports every option."""
    merged: Schema = {}
    for group in groups():
        for cls in options(group).values():
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


def store(placeholders: bool = False) -> None:
    """Publish every option to Hydra's ConfigStore (package ``_global_``: keys as declared), each
    node with its entry of the ``choices`` record. An option not imported yet (or every option,
    with ``placeholders``) is published as its record alone: enough to compose which options a
    command chooses (``resolve``), not to check keys."""
    cs = ConfigStore.instance()
    for group, opts in _OPTIONS.items():
        for name, entry in opts.items():
            real = isinstance(entry, type) and not placeholders
            node = structured(schema_of(entry)) if real else OmegaConf.create({})
            node[RECORD] = {group: name}
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


def publish(choices: Mapping[str, str]) -> None:
    """Import the options ``choices`` (``{group: option}``) names, and publish their nodes."""
    for group, name in choices.items():
        if name in _OPTIONS.get(group, {}):
            option(group, name)
    store()


LEGACY = {"model": "model", "task": "task", "optimizer": "optimizer.name"}  # where older runs recorded choices


def read_saved(path: Path) -> DictConfig:
    """A run's saved config (``.hydra/config.yaml``), its ``choices`` record made from the keys
    that older runs recorded choices in (``model``, ``task``, ``optimizer.name``) where it has
    none, those keys removed; ConfigError when the file is not a YAML mapping."""
    cfg = load_yaml(path)
    if RECORD in cfg:
        return cfg
    record = {}
    with open_dict(cfg):
        for group, key in LEGACY.items():
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if OmegaConf.is_dict(node) and leaf in node:
                record[group] = str(node[leaf])
                del node[leaf]
        cfg[RECORD] = {**{group: chosen({}, group) for group in groups()}, **record}
    return cfg
