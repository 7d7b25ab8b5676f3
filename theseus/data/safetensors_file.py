"""A safetensors file (Hugging Face's weights format): its header, and its tensors as read-only
views of a memory map.

    f = SafetensorsFile("model.safetensors")
    f.tensors["lm_head.weight"]    # Entry: dtype, shape, place in the file
    f.read("lm_head.weight")       # np.ndarray, the stored dtype and shape, a view of the file mapped
    write_safetensors(tensors, "model.safetensors")   # as transformers writes it, readable as the umask lets files be

The format: the header's size (8 bytes, little-endian), the JSON header (``name: {dtype, shape,
data_offsets}``, and ``__metadata__``), then the data, C-ordered and little-endian. It is read
here rather than by ``safetensors.safe_open``, whose ``get_tensor`` copies every tensor it
returns: the loader copies each parameter once anyway, into the memory its devices read
(``theseus.interop.loading``), so a view spares a copy of the whole model and its page faults.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from theseus.config import ConfigError

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
          "BOOL": np.bool_}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tensor of the file: its dtype, shape and bytes ``[begin, end)`` (offsets in the file)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(file: BinaryIO, where: str | Path) -> tuple[bytes, dict[str, Entry]]:
    """``(header, name -> Entry)`` of the safetensors file open in ``file`` (read from its start);
    ConfigError naming ``where`` when it is not one (truncated, or a header that does not parse)."""
    size = file.seek(0, 2)
    file.seek(0)
    length = int.from_bytes(file.read(8), "little")
    if size < 8 or 8 + length > size:
        raise _unreadable(where, f"a header of {length} bytes in a file of {size}")
    header = file.read(length)
    try:
        entries = {name: _entry(info, 8 + length) for name, info in json.loads(header).items()
                   if name != "__metadata__"}
    except (ValueError, KeyError, TypeError) as exc:
        raise _unreadable(where, f"its header: {exc}") from exc
    beyond = next((name for name, entry in entries.items() if entry.end > size), None)
    if beyond is not None:
        raise _unreadable(where, f"tensor {beyond} ends past the file's end")
    return header, entries


def _entry(info: dict, start: int) -> Entry:
    begin, end = info["data_offsets"]
    dtype, shape = np.dtype(DTYPES[info["dtype"]]), tuple(int(n) for n in info["shape"])
    if not 0 <= begin <= end or end - begin != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"offsets {begin}..{end} do not hold {info['dtype']} {list(shape)}")
    return Entry(dtype, shape, start + begin, start + end)


def _unreadable(where: str | Path, reason: str) -> ConfigError:
    return ConfigError(f"{where} is not a readable safetensors file ({reason}): save or download it again")


class SafetensorsFile:
    """A safetensors file's tensors, each read as a view of its own memory map (see the module):
    its pages leave the process with the last view of it, so that loading a model holds one
    tensor's, never the file's."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as file:
            _, self.tensors = read_header(file, path)

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name``: a read-only view of the file, its stored dtype and shape;
        ConfigError when the file lacks it."""
        if name not in self.tensors:
            raise ConfigError(f"{self.path} has no tensor {name!r}: save or download the model again")
        entry = self.tensors[name]
        if entry.begin == entry.end:  # nothing to map
            return np.empty(entry.shape, entry.dtype)
        return np.asarray(np.memmap(self.path, entry.dtype, "r", entry.begin, entry.shape))


def write_safetensors(tensors: Mapping[str, np.ndarray], path: Path) -> None:
    """Write ``tensors`` to ``path`` with transformers' metadata (PyTorch layout), its mode that of any
    file the user makes (``-rw-r--r--`` under umask 022): safetensors itself leaves it ``-rw-------``,
    which a team sharing the folder, or a server serving it, cannot read."""
    save_file(dict(tensors), str(path), metadata={"format": "pt"})
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    """The process's umask (set to 077 for the instant of reading it: a file another thread makes then is
    only the more private)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
