"""A LoRA run's frozen base: the weights ``trainer.init_from`` gave it, which its checkpoints
name instead of holding. Such a checkpoint holds the trainable params (the adapters), their
optimizer state and a record of the base: its folder and a fingerprint of its weights.

    base = FrozenBase(folder, load)   # load(folder, params layout) -> the base's params on their shards
    base.record                       # {"folder": ..., "fingerprint": ...}: saved with each checkpoint
    base.check(saved, checkpoint)     # ConfigError when the weights there are not the ones the adapters trained on
    params = with_part(base.load(layout), saved_params)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from flax import traverse_util

from theseus.config import ConfigError
from theseus.data.gguf_file import open_gguf
from theseus.data.safetensors_file import read_header
from theseus.model.lora import trainable
from theseus.sources.checkpoint_folders import base_record, step_dir

SAMPLE = 4096  # bytes read at each end of each tensor


def fingerprint(folder: Path) -> str:
    """A digest of the weights in ``folder``, cheap at any size: of a Hugging Face folder, each
    safetensors file's name, size and header (every tensor's name, dtype, shape and place), and
    the first and last 4 KiB of every tensor's data; of a GGUF file (``folder`` a file), its size,
    header (metadata and tensor table) and the same samples of every tensor; of a theseus
    checkpoint, each file's path, size and first and last 4 KiB (Orbax names its data files by
    their content). A copy matches; other weights (another model, these retrained, a tensor
    rewritten) do not."""
    digest = hashlib.sha256()
    if folder.is_file():  # a GGUF file (its name aside: a copy under another name matches)
        digest.update(f"{folder.stat().st_size}\n".encode())
        with folder.open("rb") as file:
            _sample(file, _gguf_spans(folder, file, digest.update), digest.update)
        return digest.hexdigest()
    tensors = sorted(folder.glob("*.safetensors"))
    for path in tensors or sorted(path for path in folder.rglob("*") if path.is_file()):
        size = path.stat().st_size
        digest.update(f"{path.relative_to(folder)}:{size}\n".encode())
        with path.open("rb") as file:
            _sample(file, _tensor_spans(file, digest.update) if tensors else [(0, size)], digest.update)
    return digest.hexdigest()


def _sample(file: BinaryIO, spans: list[tuple[int, int]], update: Callable[[bytes], None]) -> None:
    """The first and last ``SAMPLE`` bytes of each ``(begin, end)`` span of ``file``, given to ``update``."""
    for begin, end in spans:
        for offset in sorted({begin, max(end - SAMPLE, begin)}):
            file.seek(offset)
            update(file.read(min(SAMPLE, end - offset)))


def _gguf_spans(path: Path, file: BinaryIO, update: Callable[[bytes], None]) -> list[tuple[int, int]]:
    """Each tensor's ``(begin, end)`` in a GGUF file, its header given whole to ``update``."""
    header = open_gguf(path)
    update(file.read(header.header_size))
    return [(tensor.begin, tensor.end) for tensor in header.tensors.values()]


def _tensor_spans(file: BinaryIO, update: Callable[[bytes], None]) -> list[tuple[int, int]]:
    """Each tensor's ``(begin, end)`` in a safetensors file, its header given whole to ``update``."""
    header, entries = read_header(file, file.name)
    update(header)
    return sorted((entry.begin, entry.end) for entry in entries.values())


@dataclasses.dataclass(frozen=True)
class FrozenBase:
    """Where a LoRA run's base comes from (``folder``) and how to load it onto a params layout."""

    folder: Path
    load: Callable[[Path, Any], Any]  # (folder, params layout: ShapeDtypeStructs with shardings) -> its params

    @functools.cached_property
    def record(self) -> dict[str, str]:
        return {"folder": str(self.folder), "fingerprint": fingerprint(self.folder)}

    def check(self, saved: Mapping[str, str], checkpoint: Path) -> None:
        """ConfigError unless the folder ``saved`` (a checkpoint's record) names holds the weights
        the checkpoint's adapters trained on."""
        require_base_weights(saved, checkpoint)


def require_base_weights(saved: Mapping[str, str], holder: Path) -> None:
    """ConfigError unless the base ``saved`` (the record of a checkpoint in ``holder``) names, a
    folder or a GGUF file, is there and holds the weights the checkpoint's adapters trained on
    (its fingerprint)."""
    folder = Path(saved["folder"])
    if not folder.exists():
        raise ConfigError(f"{holder} holds LoRA adapters without their base, {folder}, which is not there: put the "
                          f"base folder back at {folder}")
    if fingerprint(folder) != saved["fingerprint"]:
        raise ConfigError(f"checkpoint {holder} holds LoRA adapters trained on the base {folder}, but the "
                          f"weights in {folder} are not that base's: put back the weights the run started from "
                          f"(or start a new run from these, in a new hydra.run.dir)")


def require_base(directory: Path) -> None:
    """ConfigError when the newest checkpoint in ``directory`` holds LoRA adapters whose base
    folder is not there, or holds other weights: said before anything reads the folder
    (``trainer.init_from``), or a resumed run writes into its directory."""
    found = step_dir(directory)
    record = base_record(found) if found else None
    if record is not None:
        require_base_weights(record, found)


def trainable_part(params: Any) -> dict:
    """``params`` (nested dicts) with only their trainable leaves (``optimizer.trainable``)."""
    return _part(params, trained=True)


def frozen_part(params: Any) -> dict:
    """``params`` (nested dicts) without their trainable leaves: what a ``FrozenBase`` holds."""
    return _part(params, trained=False)


def _part(params: Any, trained: bool) -> dict:
    mask = traverse_util.flatten_dict(trainable(params))
    return traverse_util.unflatten_dict({path: leaf for path, leaf in traverse_util.flatten_dict(params).items()
                                         if mask[path] == trained})


def with_part(params: Any, part: Any) -> dict:
    """``params`` with the leaves ``part`` holds (a ``trainable_part``) taken from it."""
    return traverse_util.unflatten_dict({**traverse_util.flatten_dict(params), **traverse_util.flatten_dict(part)})
