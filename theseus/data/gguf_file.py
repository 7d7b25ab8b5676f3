"""A GGUF file (llama.cpp's one-file model format): its header, read once per process, and its
tensors, dequantised one at a time.

    f = open_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    f.metadata["general.architecture"]       # "llama"; every key-value pair, arrays as lists
    f.tensors["blk.0.attn_q.weight"]         # TensorInfo: ggml type, shape (numpy order), place
    f.read("blk.0.attn_q.weight")            # float32 [576, 576], dequantised by the gguf package

Both the tokenizer (``theseus.data.gguf_tokenizer``) and the model (``theseus.interop.gguf``) come
from one file. The header is parsed here, with ``struct`` over a memory map, rather than by
``gguf.GGUFReader``, which makes a numpy view of every string of the vocabulary (seconds for a
50k-token one, against a tenth of one); the format is GGUF's, versions 2 and 3, little-endian.
The tensors stay on disk until ``read`` dequantises one (``gguf.quants.dequantize``: F32, F16,
BF16 and every quantisation the package knows: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, ...).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import mmap
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize

from theseus.config import ConfigError

SUFFIX = ".gguf"
MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 counted in 32 bits; no file in use still has it
ALIGNMENT = 32  # where the tensors' data begins and each tensor starts: general.alignment, else this
SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
           GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
           GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix, as llama.cpp and transformers tell)."""
    return str(path).lower().endswith(SUFFIX)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where a tensor lies in the file: ``shape`` in numpy order (ggml lists it reversed),
    ``begin`` and ``end`` its bytes' offsets from the start of the file."""

    kind: GGMLQuantizationType
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclasses.dataclass(frozen=True)
class GGUFFile:
    """A GGUF file's header: ``metadata`` (key -> value), ``tensors`` (name -> TensorInfo, in the
    file's order) and ``header_size``, where the tensors' data begins."""

    path: Path
    metadata: Mapping[str, Any]
    tensors: Mapping[str, TensorInfo]
    header_size: int

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` dequantised to float32, in numpy order (a Linear weight: ``[out, in]``)."""
        info = self.tensors[name]
        raw = np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.begin, shape=(info.end - info.begin,))
        block, size = GGML_QUANT_SIZES[info.kind]
        rows = raw.reshape(*info.shape[:-1], info.shape[-1] // block * size)
        try:
            return np.asarray(dequantize(rows, info.kind), dtype=np.float32).reshape(info.shape)
        except NotImplementedError as exc:
            raise ConfigError(f"{self.path}: tensor {name} is stored as {info.kind.name}, which the gguf package "
                              f"cannot dequantise: convert the file to another type (llama-quantize)") from exc


def open_gguf(path: str | Path) -> GGUFFile:
    """The header of the GGUF file at ``path``; ConfigError naming it when it is missing or does
    not read as one."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: give the path of a GGUF model file (llama.cpp's .gguf)")
    stat = path.stat()
    return _open(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _open(path: Path, size: int, mtime_ns: int) -> GGUFFile:
    """``open_gguf`` of one version of a file (``size`` and ``mtime_ns`` key the cache)."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else \
            contextlib.nullcontext(b"") as blob:
        try:
            return _parse(path, _Cursor(blob))
        except (struct.error, UnicodeDecodeError, ValueError) as exc:  # truncated, or not GGUF at all
            raise ConfigError(f"{path} does not read as a GGUF file ({exc}): give a file that llama.cpp's "
                              f"convert_hf_to_gguf.py (or gguf.GGUFWriter) wrote") from exc


def _parse(path: Path, cursor: _Cursor) -> GGUFFile:
    if cursor.take(4) != MAGIC:
        raise ValueError("it does not begin with the GGUF magic bytes")
    version, n_tensors, n_values = cursor.unpack("<IQQ")
    if version not in VERSIONS:
        raise ValueError(f"version {version} (big-endian, or unknown); theseus reads versions "
                         f"{' and '.join(map(str, VERSIONS))}, little-endian")
    metadata = {}
    for _ in range(n_values):
        key = cursor.string()
        metadata[key] = cursor.value(GGUFValueType(cursor.unpack("<I")[0]))
    table = []
    for _ in range(n_tensors):
        name = cursor.string()
        (dims,) = cursor.unpack("<I")
        shape = tuple(reversed(cursor.unpack(f"<{dims}Q")))
        kind, offset = cursor.unpack("<IQ")
        table.append((name, GGMLQuantizationType(kind), shape, offset))
    alignment = metadata.get("general.alignment", ALIGNMENT)
    start = -(-cursor.at // alignment) * alignment
    tensors = {}
    for name, kind, shape, offset in table:
        block, size = GGML_QUANT_SIZES[kind]
        begin = start + offset
        tensors[name] = TensorInfo(kind, shape, begin, begin + math.prod(shape) // block * size)
        if tensors[name].end > len(cursor.blob):
            raise ValueError(f"tensor {name} runs past the end of the file (truncated?)")
    return GGUFFile(path, metadata, tensors, start)


class _Cursor:
    """Reads little-endian values from a file's bytes, front to back."""

    def __init__(self, blob: bytes | mmap.mmap):
        self.blob, self.at = blob, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.blob):
            raise ValueError("the file ends inside its header (truncated?)")
        self.at += n
        return self.blob[self.at - n: self.at]

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def string(self) -> str:
        return self.take(self.unpack("<Q")[0]).decode("utf-8")

    def value(self, kind: GGUFValueType) -> Any:
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind != GGUFValueType.ARRAY:
            return _shortest(kind, self.unpack("<" + SCALARS[kind])[0])
        item, count = self.unpack("<IQ")
        item = GGUFValueType(item)
        if item in SCALARS:  # a block of numbers: one unpack
            return [_shortest(item, value) for value in self.unpack(f"<{count}{SCALARS[item]}")]
        return [self.value(item) for _ in range(count)]


def _shortest(kind: GGUFValueType, value: Any) -> Any:
    """A float32 value as the shortest decimal that is the same float32 (1e-05, not
    9.999999747378752e-06): what the converter was given, and what an export writes back."""
    return float(str(np.float32(value))) if kind == GGUFValueType.FLOAT32 else value
