"""A LoRA run's frozen base: the weights ``trainer.init_from`` gave it, which its checkpoints
name instead of holding. Such a checkpoint holds the trainable params (the adapters), their
optimizer state and a record of the base: its folder and a fingerprint of its weights.

    base = FrozenBase(folder, load)   # load(params layout) -> the base's params, fresh adapters, on their shards
    base.record                       # {"folder": ..., "fingerprint": ...}: saved with each checkpoint
    base.check(saved, checkpoint)     # ConfigError when the weights there are not the ones the adapters trained on
    params = with_part(base.load(layout), saved_params)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flax import traverse_util

from theseus.config import ConfigError
from theseus.training.optimizer import trainable

SAMPLE = 4096  # bytes read at each end of each tensor


def fingerprint(folder: Path) -> str:
    """A digest of the safetensors weights in ``folder``, cheap at any size: each file's name,
    size and header (every tensor's name, dtype, shape and place), and the first and last 4 KiB
    of every tensor's data. A copy of the folder matches; other weights (another model, these
    retrained, a tensor rewritten) do not."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as file:
            head = file.read(8)
            header = file.read(int.from_bytes(head, "little"))
            digest.update(f"{path.name}:{path.stat().st_size}\n".encode() + header)
            spans = [entry["data_offsets"] for name, entry in json.loads(header or b"{}").items()
                     if name != "__metadata__"]
            for begin, end in sorted(spans):
                for offset in sorted({begin, max(end - SAMPLE, begin)}):
                    file.seek(8 + len(header) + offset)
                    digest.update(file.read(min(SAMPLE, end - offset)))
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class FrozenBase:
    """Where a LoRA run's base comes from (``folder``) and how to load it onto a params layout."""

    folder: Path
    load: Callable[[Any], Any]  # params layout (ShapeDtypeStructs with shardings) -> params, adapters fresh

    @functools.cached_property
    def record(self) -> dict[str, str]:
        return {"folder": str(self.folder), "fingerprint": fingerprint(self.folder)}

    def check(self, saved: Mapping[str, str], checkpoint: Path) -> None:
        """ConfigError unless ``folder`` holds the weights the checkpoint's adapters trained on."""
        if not self.folder.is_dir():
            raise ConfigError(f"checkpoint {checkpoint} holds LoRA adapters without their base, {self.folder}, "
                              f"which is not there: put the base folder back at {self.folder}")
        if fingerprint(self.folder) != saved["fingerprint"]:
            raise ConfigError(f"checkpoint {checkpoint} holds LoRA adapters trained on the base {saved['folder']}, "
                              f"but the weights in {self.folder} are not that base's: put back the weights the run "
                              f"started from (or start a new run from these, in a new hydra.run.dir)")


def trainable_part(params: Any) -> dict:
    """``params`` (nested dicts) with only their trainable leaves (``optimizer.trainable``)."""
    mask = traverse_util.flatten_dict(trainable(params))
    return traverse_util.unflatten_dict({path: leaf for path, leaf in traverse_util.flatten_dict(params).items()
                                         if mask[path]})


def with_part(params: Any, part: Any) -> dict:
    """``params`` with the leaves ``part`` holds (a ``trainable_part``) taken from it."""
    return traverse_util.unflatten_dict({**traverse_util.flatten_dict(params), **traverse_util.flatten_dict(part)})
