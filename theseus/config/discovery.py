"""Discovery of the modules that register options: theseus's own and the user's.

Two sources, imported before any config is composed, in every process that runs a job:

- installed packages, through the entry-point group ``theseus.modules`` (theseus declares its
  own built-in options there too)::

      [project.entry-points."theseus.modules"]
      mymodels = "mymodels.models"

- the user's project folder: the nearest ``pyproject.toml`` from the working directory
  upwards that has a ``[tool.theseus]`` table; its folder goes on ``sys.path``, and its
  ``experiments/`` and ``sweeps/`` add to (and override) the shipped ones::

      [tool.theseus]
      imports = ["mymodels"]
"""

from __future__ import annotations

import importlib
import sys
import tomllib
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from theseus.config.errors import ConfigError

GROUP = "theseus.modules"  # the entry-point group of modules that register options


@dataclass(frozen=True)
class Project:
    """A user's project folder: where its ``pyproject.toml`` is and what it imports."""

    root: Path
    imports: tuple[str, ...]

    @property
    def pyproject(self) -> Path:
        return self.root / "pyproject.toml"


def find_project(start: Path | None = None) -> Project | None:
    """The project of the nearest ``pyproject.toml`` from ``start`` (the working directory)
    upwards; None when that file has no ``[tool.theseus]`` table, or there is none."""
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        path = folder / "pyproject.toml"
        if path.is_file():
            return _read(path)
    return None


def _read(path: Path) -> Project | None:
    try:
        table = tomllib.loads(path.read_text()).get("tool", {}).get("theseus")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} does not parse as TOML ({exc}): fix the file") from exc
    if table is None:
        return None
    imports = table.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(name, str) for name in imports):
        raise ConfigError(f"{path}: [tool.theseus] imports must be a list of module names, "
                          f'e.g. imports = ["mymodels"], got {imports!r}')
    return Project(path.parent, tuple(imports))


def load_modules() -> Project | None:
    """Import every module that registers options (idempotent); returns the user's project.

    A module that fails to import is a ConfigError naming it and what asked for it.
    """
    for point in entry_points(group=GROUP):
        _import(point.value, f"the entry point {point.name!r} of group {GROUP} "
                             f"(package {point.dist.name if point.dist else '?'})")
    project = find_project()
    if project is not None:
        if str(project.root) not in sys.path:
            sys.path.insert(0, str(project.root))
        for name in project.imports:
            _import(name, f"{project.pyproject} ([tool.theseus] imports)")
    return project


def object_spec(spec: str, key: str) -> tuple[str, str]:
    """``(module, name)`` of ``module:name`` (dotted names); ConfigError naming ``key`` otherwise."""
    module, _, name = spec.partition(":")
    if not module or not name or not all(part.isidentifier() for part in (*module.split("."), *name.split("."))):
        raise ConfigError(f"{key}={spec} is not module:function: e.g. {key}=rewards:correct for the function "
                          f"correct of rewards.py in the working directory or your project's folder")
    return module, name


def user_object(spec: str, key: str) -> Any:
    """The object ``spec`` (``module:name``, the module dotted) names, imported as a user's modules
    are: from the working directory (a ``rewards.py`` beside the command) or the project's folder
    (``find_project``), both put on ``sys.path``. ConfigError naming ``key`` when ``spec`` is not of
    that form, the module does not import, or it has no such name."""
    module, name = object_spec(spec, key)
    project = find_project()
    folders = [str(Path.cwd()), *([str(project.root)] if project else [])]
    for folder in folders:
        if folder not in sys.path:
            sys.path.insert(0, folder)
    _import(module, f"{key}={spec} (looked for in {' and '.join(folders)})")
    found: Any = sys.modules[module]
    for part in name.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"{key}={spec}: the module {module} ({getattr(sys.modules[module], '__file__', '?')}) "
                              f"has no {name}")
        found = getattr(found, part)
    return found


def _import(name: str, asked_by: str) -> None:
    if name in sys.modules:
        return
    try:
        importlib.import_module(name)
    except ConfigError as exc:
        raise ConfigError(f"importing {name!r}, asked for by {asked_by}: {exc}") from exc
    except Exception as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"cannot import {name!r}, asked for by {asked_by}: {type(exc).__name__}: {detail}") from exc


HOW_TO_DECLARE = ('declare the module that defines it in your project\'s pyproject.toml '
                  '([tool.theseus] imports = ["mymodels"]) or in an installed package\'s '
                  f'entry-point group {GROUP}')
