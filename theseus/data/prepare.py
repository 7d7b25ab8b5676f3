"""Preparation: tokenize a corpus once into train/val shards in the cache, streaming.

    python -m theseus.data.prepare [data.* overrides, or any run's overrides]   # theseus.cli.prepare

The token stream (each document followed by the tokenizer's end-of-document token, if it has
one) is cut into blocks; a seeded ``data.val_fraction`` of them form ``val.bin``, the rest
``train.bin``. A second call with the same settings finds the cached folder and does nothing.

Memory stays bounded whatever the corpus's size: a thread reads and parses documents a batch
ahead (``AHEAD`` batches of about a MiB) while the tokenizer encodes the previous one (its
``encode_batch`` releases the GIL), tokens go to disk as they come, and the split reads that
stream back a block at a time (a read, not a memory map, whose pages would count as the
process's own).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from theseus.config import ConfigError
from theseus.data.cache import building, cache_folder, settings
from theseus.data.config import DataConfig
from theseus.data.corpus_files import corpus_files
from theseus.data.documents import Documents, documents
from theseus.data.progress import progress
from theseus.data.records import SOURCES as RECORDS
from theseus.data.records import check_text_field
from theseus.data.shards import META_FILE, ShardMeta, on_disk, shard_file, token_dtype, write_meta
from theseus.data.tokenizer import NAMES, ByteTokenizer, HFTokenizer, Tokenizer, fit_tokenizer

MIN_BLOCKS = 100  # the split's granularity: at least this many blocks...
MAX_BLOCK = 1 << 14  # ...of at most this many tokens
AHEAD = 4  # batches of documents read ahead of the tokenizer


@dataclasses.dataclass(frozen=True)
class Written:
    """What ``_tokenize`` wrote: tokens, documents, and the UTF-8 bytes of their text."""

    tokens: int
    documents: int
    text_bytes: int


def prepare(cfg: DataConfig) -> Path:
    """The cache folder holding ``cfg``'s corpus as shards, tokenizing it on the first call only.

    Raises ConfigError (nothing written) for a missing path, an empty corpus, an unreadable
    file or row, or a tokenizer file that does not parse.
    """
    files = corpus_files(cfg)
    given = None if cfg.tokenizer in NAMES else HFTokenizer.from_file(cfg.tokenizer)  # fails before any work
    if cfg.source in RECORDS and (cfg.tokenizer == "char" or given is not None and given.eot is None):
        raise ConfigError(f"data.tokenizer={cfg.tokenizer} has no end-of-document token, which ends each row of "
                          f"data.source={cfg.source}: use byte, bpe, or a tokenizer.json with <|endoftext|> "
                          "or a tokenizer_config.json beside it naming its eos_token")
    recorded = settings(cfg, files)
    folder = cache_folder(cfg, recorded)
    if (folder / META_FILE).is_file():
        return folder
    check_text_field(files, cfg.source, cfg.text_field)
    total = sum(path.stat().st_size for path in files)
    if given is not None:
        tokenizer = given
    elif cfg.tokenizer == "byte":
        tokenizer = ByteTokenizer()
    else:
        texts = _texts(cfg, files, total, f"{cfg.source}: fitting the {cfg.tokenizer} vocabulary")
        tokenizer = fit_tokenizer(cfg.tokenizer, texts, cfg.bpe_vocab_size)
    dtype = token_dtype(tokenizer.vocab_size)
    with building(folder) as scratch:
        stream = scratch / "stream.bin"
        written = _tokenize(documents(cfg, files), tokenizer, dtype, stream, total,
                            f"{cfg.source}: tokenizing ({cfg.tokenizer})")
        if not written.documents:
            raise ConfigError(f"data.path={cfg.path} holds no documents (no rows in {len(files)} file(s)): "
                              "point data.path at the corpus, or give it some rows")
        counts = _split(stream, scratch, dtype, cfg.val_fraction, cfg.seed)
        stream.unlink()
        tokenizer.save(scratch)
        write_meta(scratch, ShardMeta(dtype=dtype, vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.kind,
                                      counts=counts, bytes_per_token=written.text_bytes / written.tokens,
                                      settings=recorded))
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


def _texts(cfg: DataConfig, files: list[Path], total: int, description: str) -> Iterator[str]:
    """Every document's text, advancing a progress bar."""
    with progress(description, total) as advance:
        for batch in documents(cfg, files):
            yield from batch.texts
            advance(batch.done, len(batch.texts))


def _tokenize(batches: Iterator[Documents], tokenizer: Tokenizer, dtype: str, out: Path, total: int,
              description: str) -> Written:
    """Write every document's ids, each followed by eot, to ``out``; what was written. ``batches``
    is read in a thread ``AHEAD`` batches ahead (with each batch's UTF-8 size)."""
    sized = ((batch, sum(len(text.encode("utf-8")) for text in batch.texts)) for batch in batches)
    tokens = docs = text_bytes = 0
    with progress(description, total) as advance, out.open("wb") as f:
        for batch, size in ahead(sized, AHEAD):
            ids = tokenizer.encode_documents(batch.texts, on_disk(dtype))
            f.write(ids.data)
            tokens, docs, text_bytes = tokens + len(ids), docs + len(batch.texts), text_bytes + size
            advance(batch.done, len(batch.texts))
    return Written(tokens, docs, text_bytes)


def ahead(items: Iterator, depth: int) -> Iterator:
    """``items``, produced by a thread up to ``depth`` ahead of the consumer; an exception raised
    producing them is raised here, and a consumer that stops early stops the thread."""
    ready: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    done = object()

    def offer(entry: tuple) -> bool:
        """Queue ``entry`` unless the consumer has stopped; whether it was queued."""
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer((item, None)):
                    return
            offer((done, None))
        except BaseException as exc:  # handed to the consumer, raised there
            offer((done, exc))

    thread = threading.Thread(target=produce, name="theseus-prepare-reader", daemon=True)
    thread.start()
    try:
        while True:
            item, error = ready.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item
    finally:
        stop.set()


def _split(stream: Path, folder: Path, dtype: str, val_fraction: float, seed: int) -> dict[str, int]:
    """Write ``stream``'s blocks to train.bin and val.bin by split_blocks(), reading one block at a
    time; their token counts."""
    itemsize = on_disk(dtype).itemsize
    block, is_val = split_blocks(stream.stat().st_size // itemsize, val_fraction, seed)
    counts = {"train": 0, "val": 0}
    with (stream.open("rb") as tokens, shard_file(folder, "train").open("wb") as train,
          shard_file(folder, "val").open("wb") as val):
        for to_val in is_val:
            part = tokens.read(block * itemsize)
            (val if to_val else train).write(part)
            counts["val" if to_val else "train"] += len(part) // itemsize
    return counts



if __name__ == "__main__":  # python -m theseus.data.prepare: the command, theseus.cli.prepare's
    from theseus.cli.command_exit import exit_after
    from theseus.cli.prepare import main

    exit_after(main)
