"""A model's name, as given, to its kind: one typed value wherever a model is named.

    source = parse_source("~/models/my-llama", key="trainer.init_from")
    source.path    # the folder, run path or file, absolute
    type(source)   # HFFolder (a Hugging Face folder), TheseusRun (a theseus run or checkpoint), GGUFFile

``trainer.init_from``, ``dpo.reference`` and the PATH of ``theseus.sample``, ``evaluate`` and
``export`` are each parsed here once, by looking at the filesystem alone (no JAX, no weights read):

- a theseus run directory, its ``checkpoints/``, or one step's folder there (``TheseusRun``);
- a folder holding ``config.json`` (``HFFolder``: what ``save_pretrained`` writes);
- a ``.gguf`` file (``GGUFFile``);
- a model id (``HuggingFaceTB/SmolLM2-135M-Instruct``) that is no local path: its snapshot in the
  local Hugging Face cache (``hub_cache``), an ``HFFolder``; an id not there is one line saying how
  to download it.

A missing path shaped as one (``outputs/tiny``: a folder here by its first part, Hydra's or theseus's
own folders, a step, a file's suffix) is a missing path, not an id to download: its line says where
it was looked for. Anything else is a ConfigError naming ``key`` and what it takes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from theseus.config import ConfigError
from theseus.config.yaml_file import load_yaml
from theseus.interop.hf_config import CONFIG_FILE
from theseus.sources.checkpoint_folders import SAVED_CONFIG, steps_in, theseus_checkpoint
from theseus.sources.hub_cache import hub_cache, hub_repo, hub_snapshot
from theseus.sources.model_source import KINDS, TAKES, ModelSource, named as _named

MODEL_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
FILE_SUFFIXES = {".gguf", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".npz", ".json", ".yaml"}
RUN_FOLDERS = {"outputs", "multirun", "checkpoints"}  # where Hydra and theseus put runs and their steps


def parse_source(given: str | os.PathLike, key: str | None = "trainer.init_from") -> ModelSource:
    """The model ``given`` names; ConfigError (naming ``key``) when it names none."""
    given, named = str(given), _named(str(given), key)
    path = Path(given).expanduser()
    if path.exists():
        return KINDS[_kind(path, named)](path.resolve(), given, key)
    if path.name.isdigit() and path.parent.is_dir() and steps_in(path.parent):
        steps = ", ".join(map(str, sorted(steps_in(path.parent))))
        raise ConfigError(f"{named}: {path.parent} holds no step {path.name}; its saved steps are {steps}")
    model_id = bool(MODEL_ID.fullmatch(given)) and path.suffix not in FILE_SUFFIXES
    if model_id and (not _path_shaped(given, path) or hub_repo(given).is_dir()):
        return KINDS["hf"](hub_snapshot(given, named), given, key)
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


def _kind(path: Path, named: str) -> str:
    """What the existing ``path`` holds (its ``KINDS`` name); ConfigError when no model."""
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
