"""Where a model comes from: one typed value wherever a model is named.

    source = parse_source("~/models/my-llama", key="trainer.init_from")
    source.kind    # "hf": a Hugging Face folder; "run": a theseus run or checkpoint; "gguf": a GGUF file
    source.path    # the folder, run path or file, absolute

``trainer.init_from``, ``dpo.reference`` and the PATH of ``theseus.sample``, ``evaluate`` and
``export`` are each parsed here once, by looking at the filesystem alone (no JAX, no weights read):

- a theseus run directory, its ``checkpoints/``, or one step's folder there (``run``);
- a folder holding ``config.json`` (``hf``: what ``save_pretrained`` writes);
- a ``.gguf`` file (``gguf``);
- a model id (``HuggingFaceTB/SmolLM2-135M-Instruct``) that is no local path: its snapshot in the
  local Hugging Face cache, resolved offline as transformers does with ``HF_HUB_OFFLINE=1`` (the
  revision ``refs/main`` names); an id not there is one line saying how to download it.

A missing path shaped as one (``outputs/tiny``: a folder here by its first part, Hydra's or theseus's
own folders, a step, a file's suffix) is a missing path, not an id to download: its line says where
it was looked for. Anything else is a ConfigError naming ``key`` and what it takes.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Literal

from theseus.config import ConfigError
from theseus.config.yaml_file import load_yaml

Kind = Literal["hf", "run", "gguf"]
CONFIG_FILE = "config.json"
SAVED_CONFIG = Path(".hydra") / "config.yaml"
TAKES = "a Hugging Face folder, a theseus run or checkpoint, a .gguf file or a model id in the local Hugging Face cache"
MODEL_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
FILE_SUFFIXES = {".gguf", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".npz", ".json", ".yaml"}
RUN_FOLDERS = {"outputs", "multirun", "checkpoints"}  # where Hydra and theseus put runs and their steps


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A model named by ``key`` (None: a command's PATH argument) as ``given``: its ``kind``
    and absolute ``path``."""

    kind: Kind
    path: Path
    given: str
    key: str | None = "trainer.init_from"

    @property
    def run_dir(self) -> Path | None:
        """A theseus run's directory (the folder holding ``.hydra/``); None for another kind, or
        checkpoints copied without their run."""
        return run_of(self.path) if self.kind == "run" else None

    @property
    def step(self) -> int | None:
        """The step a run's path names (its step folder), else None: the newest. (A run directory
        named by a number, as a multirun's are, names no step.)"""
        named = self.kind == "run" and self.path.name.isdigit() and not (self.path / "checkpoints").is_dir()
        return int(self.path.name) if named else None

    @property
    def imported(self) -> bool:
        """Weights from outside theseus (a Hugging Face folder or a GGUF file), whose vocabulary
        is kept as it is (import then export is the identity)."""
        return self.kind != "run"

    @property
    def what(self) -> str:
        """The kind in words, for messages."""
        return {"hf": "a Hugging Face folder", "run": "a theseus run", "gguf": "a GGUF file"}[self.kind]

    def __str__(self) -> str:
        return _named(self.given, self.key)


def parse_source(given: str | os.PathLike, key: str | None = "trainer.init_from") -> ModelSource:
    """The model ``given`` names; ConfigError (naming ``key``) when it names none."""
    given, named = str(given), _named(str(given), key)
    path = Path(given).expanduser()
    if path.exists():
        return ModelSource(_kind(path, named), path.resolve(), given, key)
    if path.name.isdigit() and path.parent.is_dir() and _steps(path.parent):
        steps = ", ".join(map(str, sorted(_steps(path.parent))))
        raise ConfigError(f"{named}: {path.parent} holds no step {path.name}; its saved steps are {steps}")
    model_id = bool(MODEL_ID.fullmatch(given)) and path.suffix not in FILE_SUFFIXES
    if model_id and (not _path_shaped(given, path) or hub_repo(given).is_dir()):
        return ModelSource("hf", hub_snapshot(given, named), given, key)
    raise ConfigError(_missing(given, path, named, model_id))


def _path_shaped(given: str, path: Path) -> bool:
    """Whether ``given``, of a model id's form, was meant as a path: its first part a folder here, or a part
    Hydra's or theseus's folder of runs or steps (``outputs/tiny``, ``multirun/3``, ``run/checkpoints``)."""
    parts = Path(given).parts
    return "/" in given and path.parent.is_dir() or bool(RUN_FOLDERS & set(parts)) or parts[-1].isdigit()


def _missing(given: str, path: Path, named: str, model_id: bool) -> str:
    """The line for a ``path`` that does not exist: where a relative one was looked for, and, when
    ``given`` has a model id's form, that the Hugging Face cache has no such model either."""
    what = "file" if path.suffix in FILE_SUFFIXES else "folder"
    notes = [] if path.is_absolute() else [f"no {what} {path.absolute()}"]
    notes += [f"no model {given} in the Hugging Face cache at {hub_cache()}"] if model_id else []
    where = f" ({', and '.join(notes)})" if notes else ""
    return f"{named} does not exist{where}: give {TAKES}"


def _named(given: str, key: str | None) -> str:
    """How errors name a source: ``key=given``, or ``given`` alone (a command's argument)."""
    return given if key is None else f"{key}={given}"


def _kind(path: Path, named: str) -> Kind:
    """What the existing ``path`` holds; ConfigError when no model."""
    if path.is_file():
        if path.suffix == ".gguf":
            return "gguf"
        raise ConfigError(f"{named} is a file, not a model: give {TAKES}")
    if theseus_checkpoint(path) is not None:
        return "run"
    if (path / ".hydra").is_dir():
        if (path / SAVED_CONFIG).is_file():
            load_yaml(path / SAVED_CONFIG)  # a config that does not parse: that first (ConfigError naming the file)
        raise ConfigError(f"{named} holds no checkpoint (checkpoints/ is empty or absent): train it first, or give a "
                          f"run directory that trainer.checkpoint_every or the end of its run saved")
    if (path / CONFIG_FILE).is_file():
        return "hf"
    ggufs = sorted(path.glob("*.gguf"))
    hint = f" (a GGUF file there: {named}/{ggufs[0].name})" if ggufs else ""
    raise ConfigError(f"{named} holds no model (no {CONFIG_FILE}, no checkpoints): give {TAKES}{hint}")


def hub_cache() -> Path:
    """The Hugging Face hub cache, where huggingface_hub puts it: ``HF_HUB_CACHE``, else
    ``HF_HOME/hub``, else ``XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_repo(model_id: str) -> Path:
    """Where the hub cache keeps ``model_id`` (``models--ORG--NAME``), whether or not it is there."""
    return hub_cache() / f"models--{model_id.replace('/', '--')}"


def hub_snapshot(model_id: str, named: str) -> Path:
    """The folder of ``model_id``'s snapshot in the hub cache (its ``refs/main``, else its only
    snapshot); ConfigError, saying how to download it, when it is not there."""
    repo = hub_repo(model_id)
    ref = repo / "refs" / "main"
    snapshots = sorted((repo / "snapshots").iterdir()) if (repo / "snapshots").is_dir() else []
    if ref.is_file():
        folder = repo / "snapshots" / ref.read_text(encoding="utf-8").strip()
    elif len(snapshots) == 1:
        folder = snapshots[0]
    else:
        raise ConfigError(f"{named} is no local path, and {model_id} is not in the Hugging Face cache "
                          f"({hub_cache()}): download it where there is a network (hf download {model_id}) "
                          f"or give {TAKES}")
    if not (folder / CONFIG_FILE).is_file():
        raise ConfigError(f"{named}: its snapshot in the Hugging Face cache ({folder}) has no "
                          f"{CONFIG_FILE}: download the whole model (hf download {model_id})")
    return folder


def _steps(folder: Path) -> list[int]:
    return [int(child.name) for child in folder.iterdir() if child.name.isdigit() and child.is_dir()]


def theseus_checkpoint(path: Path) -> Path | None:
    """``path`` when it holds theseus checkpoints: a run directory with ``checkpoints/``, that
    folder, or one step's folder in it; None otherwise."""
    path = Path(path).expanduser()
    if (path / "checkpoints").is_dir() and _steps(path / "checkpoints") or path.is_dir() and _steps(path):
        return path
    if path.name.isdigit() and (path / "state").is_dir():
        return path
    return None


def run_of(checkpoint: Path) -> Path | None:
    """The run directory of a theseus checkpoint path (the folder holding ``.hydra/``)."""
    for folder in (checkpoint, *checkpoint.parents[:2]):
        if (folder / SAVED_CONFIG).is_file():
            return folder
    return None
