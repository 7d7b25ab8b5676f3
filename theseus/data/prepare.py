"""Preparation: tokenize a corpus once into train/val shards in the cache.

    python -m theseus.data.prepare [data.* overrides, or any run's overrides]

The token stream (each document followed by the tokenizer's end-of-text token, if it has one)
is cut into blocks; a seeded ``data.val_fraction`` of them form ``val.bin``, the rest
``train.bin``. A second call with the same settings finds the cached folder and does nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from theseus.config import ConfigError, configuration, configure
from theseus.config.compose import compose
from theseus.data.cache import building, cache_folder, settings
from theseus.data.config import DataConfig
from theseus.data.progress import progress
from theseus.data.shards import META_FILE, ShardMeta, on_disk, read_meta, shard_file, token_dtype, write_meta
from theseus.data.sources import corpus_files, read_text
from theseus.data.tokenizer import NAMES, ByteTokenizer, HFTokenizer, Tokenizer, fit_tokenizer

MIN_BLOCKS = 100  # the split's granularity: at least this many blocks...
MAX_BLOCK = 1 << 14  # ...of at most this many tokens
CHUNK_BYTES = 1 << 20  # text encoded per batch (and per progress update)


def prepare(cfg: DataConfig) -> Path:
    """The cache folder holding ``cfg``'s corpus as shards, tokenizing it on the first call only.

    Raises ConfigError (nothing written) for a missing path, an empty corpus, an unreadable
    file or a tokenizer file that does not parse.
    """
    files = corpus_files(cfg)
    given = None if cfg.tokenizer in NAMES else HFTokenizer.from_file(cfg.tokenizer)  # fails before any work
    recorded = settings(cfg, files)
    folder = cache_folder(cfg, recorded)
    if (folder / META_FILE).is_file():
        return folder
    sizes = [path.stat().st_size for path in files]
    if given is not None:
        tokenizer = given
    elif cfg.tokenizer == "byte":
        tokenizer = ByteTokenizer()
    else:
        texts = _reading(files, sizes, f"{cfg.source}: fitting the {cfg.tokenizer} vocabulary")
        tokenizer = fit_tokenizer(cfg.tokenizer, texts, cfg.bpe_vocab_size)
    dtype = token_dtype(tokenizer.vocab_size)
    with building(folder) as scratch:
        stream = scratch / "stream.bin"
        n_tokens = _tokenize(files, sizes, tokenizer, dtype, stream, f"{cfg.source}: tokenizing ({cfg.tokenizer})")
        counts = _split(stream, scratch, dtype, cfg.val_fraction, cfg.seed)
        stream.unlink()
        tokenizer.save(scratch)
        write_meta(scratch, ShardMeta(dtype=dtype, vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.kind,
                                      counts=counts, bytes_per_token=sum(sizes) / n_tokens, settings=recorded))
    return folder


def split_blocks(n_tokens: int, val_fraction: float, seed: int) -> tuple[int, np.ndarray]:
    """``(block, is_val)``: the stream cut into ``len(is_val)`` blocks of ``block`` tokens (the
    last may be shorter); ``round(val_fraction * blocks)`` of them, at least one when
    ``val_fraction > 0`` and never all, drawn by ``seed`` for validation."""
    block = max(1, min(MAX_BLOCK, -(-n_tokens // MIN_BLOCKS)))
    n_blocks = -(-n_tokens // block)
    n_val = min(max(round(val_fraction * n_blocks), int(val_fraction > 0)), n_blocks - 1)
    is_val = np.zeros(n_blocks, dtype=bool)
    is_val[np.random.default_rng(seed).choice(n_blocks, size=n_val, replace=False)] = True
    return block, is_val


def _reading(files: list[Path], sizes: list[int], description: str) -> Iterator[str]:
    """Each file's text, advancing a progress bar."""
    with progress(description, sum(sizes)) as advance:
        for path, size in zip(files, sizes, strict=True):
            yield read_text(path)
            advance(size)


def _tokenize(files: list[Path], sizes: list[int], tokenizer: Tokenizer, dtype: str, out: Path,
              description: str) -> int:
    """Write every document's ids (then eot) to ``out``; the number of tokens written."""
    eot = np.array([] if tokenizer.eot is None else [tokenizer.eot], dtype=on_disk(dtype))
    n_tokens = 0
    with progress(description, sum(sizes)) as advance, out.open("wb") as f:
        for chunk in _chunks(list(zip(files, sizes, strict=True))):
            for ids in tokenizer.encode_batch([read_text(path) for path, _ in chunk]):
                f.write(ids.astype(eot.dtype).tobytes() + eot.tobytes())
                n_tokens += len(ids) + len(eot)
            advance(sum(size for _, size in chunk))
    return n_tokens


def _chunks(items: list[tuple[Path, int]]) -> Iterator[list[tuple[Path, int]]]:
    """Consecutive runs of files of about CHUNK_BYTES in all."""
    chunk, total = [], 0
    for path, size in items:
        chunk.append((path, size))
        total += size
        if total >= CHUNK_BYTES:
            yield chunk
            chunk, total = [], 0
    if chunk:
        yield chunk


def _split(stream: Path, folder: Path, dtype: str, val_fraction: float, seed: int) -> dict[str, int]:
    """Write ``stream``'s blocks to train.bin and val.bin by split_blocks(); their token counts."""
    tokens = np.memmap(stream, dtype=on_disk(dtype), mode="r")
    block, is_val = split_blocks(len(tokens), val_fraction, seed)
    counts = {"train": 0, "val": 0}
    with shard_file(folder, "train").open("wb") as train, shard_file(folder, "val").open("wb") as val:
        for i, to_val in enumerate(is_val):
            part = tokens[i * block:(i + 1) * block]
            (val if to_val else train).write(part.tobytes())
            counts["val" if to_val else "train"] += len(part)
    del tokens
    return counts


def main(argv: list[str]) -> int:
    try:
        with configuration(compose(argv)):
            cfg = configure(DataConfig)
        folder = prepare(cfg)
        meta = read_meta(folder)
    except ConfigError as exc:
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    print(f"{folder}: {meta.counts['train']:,} train + {meta.counts['val']:,} val tokens, "
          f"{meta.tokenizer} vocabulary of {meta.vocab_size:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
