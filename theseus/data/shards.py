"""Token shards: flat binary token files and the ``meta.json`` that describes them.

The layout of nanoGPT's ``train.bin``/``val.bin``: token ids back to back, little-endian uint16
(uint32 for a vocabulary over 65,536), no header. ``meta.json`` beside them::

    {"dtype": "uint16", "vocab_size": 257, "tokenizer": "byte",
     "counts": {"train": 11997514, "val": 121187}, "bytes_per_token": 1.0}

``tokenizer`` is ``byte``, ``char`` (``chars.json`` beside), ``bpe`` (``tokenizer.json`` beside),
or another name for shards made elsewhere (``data.tokenizer`` then names their tokenizer.json).
``bytes_per_token`` (UTF-8 bytes of text per token) is optional; ``settings`` records what a
prepared corpus was made from.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from theseus.config import ConfigError

SPLITS = ("train", "val")
DTYPES = ("uint16", "uint32")
META_FILE = "meta.json"
CHECKED_PREFIX = 1 << 20  # tokens of each shard checked against vocab_size when opened


@dataclasses.dataclass(frozen=True)
class ShardMeta:
    dtype: str
    vocab_size: int
    tokenizer: str
    counts: dict[str, int]
    bytes_per_token: float | None = None
    settings: dict = dataclasses.field(default_factory=dict)


def token_dtype(vocab_size: int) -> str:
    """The narrowest shard dtype that holds every id below ``vocab_size``."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def on_disk(dtype: str) -> np.dtype:
    """``dtype`` in the shards' byte order: little-endian, whatever the machine."""
    return np.dtype(dtype).newbyteorder("<")


def shard_file(folder: Path, split: str) -> Path:
    return folder / f"{split}.bin"


def write_meta(folder: Path, meta: ShardMeta) -> None:
    (folder / META_FILE).write_text(json.dumps(dataclasses.asdict(meta), indent=2) + "\n", encoding="utf-8")


def read_meta(folder: Path) -> ShardMeta:
    """The validated ``meta.json`` of ``folder``; ConfigError naming the file and the fix."""
    path = folder / META_FILE
    if not path.is_file():
        raise ConfigError(f"{path} is missing: a shard folder holds train.bin, val.bin and meta.json "
                          "(python -m theseus.data.prepare writes one)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} does not parse as JSON ({exc}): fix or rewrite it") from exc
    for key in ("dtype", "vocab_size", "tokenizer", "counts"):
        if key not in raw:
            raise ConfigError(f"{path} lacks {key!r}: add it (dtype, vocab_size, tokenizer, counts are required)")
    meta = ShardMeta(**{f.name: raw[f.name] for f in dataclasses.fields(ShardMeta) if f.name in raw})
    if meta.dtype not in DTYPES:
        raise ConfigError(f"{path}: dtype must be uint16 or uint32, got {meta.dtype!r}: fix meta.json")
    if not isinstance(meta.vocab_size, int) or meta.vocab_size < 1:
        raise ConfigError(f"{path}: vocab_size must be a positive integer, got {meta.vocab_size!r}: fix meta.json")
    if meta.vocab_size > np.iinfo(meta.dtype).max + 1:
        raise ConfigError(f"{path}: vocab_size {meta.vocab_size} does not fit dtype {meta.dtype}: "
                          "fix meta.json or write the shards as uint32")
    counts = meta.counts if isinstance(meta.counts, dict) else {}
    if any(not isinstance(counts.get(split), int) or counts[split] < 0 for split in SPLITS):
        raise ConfigError(f"{path}: counts must give the tokens of train and val, got {meta.counts!r}: fix meta.json")
    rate = meta.bytes_per_token
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0):
        raise ConfigError(f"{path}: bytes_per_token must be a positive number (UTF-8 bytes of text per token) or "
                          f"null, got {rate!r}: fix meta.json")
    return meta


def read_tokens(folder: Path, meta: ShardMeta) -> dict[str, np.ndarray]:
    """Each split's tokens, memory-mapped; ConfigError when a file disagrees with ``meta``."""
    dtype = on_disk(meta.dtype)
    tokens = {}
    for split in SPLITS:
        path = shard_file(folder, split)
        if not path.is_file():
            raise ConfigError(f"{path} is missing: give the shard folder both train.bin and val.bin")
        size = os.path.getsize(path)
        if size % dtype.itemsize or size // dtype.itemsize != meta.counts[split]:
            raise ConfigError(f"{path} is {size} bytes, not {meta.counts[split]} {meta.dtype} tokens as "
                              f"{folder / META_FILE} says: fix its dtype and counts, or re-tokenize")
        array = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
        top = int(array[:CHECKED_PREFIX].max(initial=0))
        if top >= meta.vocab_size:
            raise ConfigError(f"{path} holds token {top}, beyond vocab_size {meta.vocab_size} of "
                              f"{folder / META_FILE}: fix its vocab_size or dtype")
        tokens[split] = array
    return tokens
