"""A model source's parts, by its kind: its config, its tensors, its tokenizer.

    hf = hf_config_of(source)       # config.json's dict (a GGUF file's, from its metadata)
    with tensors_of(source) as tensors:
        wte = tensors.read("model.embed_tokens.weight")

The kinds differ here alone (``theseus.model.source``: where a model comes from); what reads a
model (``theseus.interop.loading.load_params``, ``init_from``, export) asks these.
A GGUF file is a Hugging Face model in another container: its metadata gives a config.json
dict, its tensors are read under Hugging Face's names, so every family's tables apply to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from theseus.config import ConfigError
from theseus.data.tokenizer import JSON_FILE
from theseus.interop import gguf
from theseus.interop.hf_config import CONFIG_FILE, read_config
from theseus.interop.hf_weights import Checkpoint
from theseus.model.source import ModelSource
from theseus.training.checkpoint import step_dir


def hf_config_of(source: ModelSource) -> dict[str, Any]:
    """The config.json ``source`` describes (a Hugging Face folder's or GGUF file's)."""
    if source.kind == "gguf":
        return gguf.config(source.path)
    if source.kind != "hf":
        raise ValueError(f"{source} is a theseus run, which has no config.json")
    return read_config(source.path)


def where(source: ModelSource) -> str:
    """The file errors about ``source``'s config name: its config.json, or the GGUF file."""
    return str(source.path / CONFIG_FILE if source.kind == "hf" else source.path)


def tensors_of(source: ModelSource) -> Checkpoint | gguf.Tensors:
    """A reader of ``source``'s tensors by their Hugging Face names (``read(name)``,
    ``unused()``; a context manager); ConfigError when they are not there."""
    if source.kind == "gguf":
        return gguf.Tensors(source.path)
    try:
        return Checkpoint(source.path)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def tokenizer_of(source: ModelSource) -> str | None:
    """What ``data.tokenizer`` becomes for ``source``: its folder's tokenizer.json, or the GGUF
    file itself (its metadata holds the tokenizer); None for a folder without one."""
    if source.kind == "gguf":
        return str(source.path)
    return str(source.path / JSON_FILE) if (source.path / JSON_FILE).is_file() else None


def base_path(source: ModelSource) -> Path:
    """What a LoRA run's checkpoints name as their base: the folder or file of the weights (a
    theseus run's step folder: its newest when the path names none)."""
    return step_dir(source.path) if source.kind == "run" else source.path
