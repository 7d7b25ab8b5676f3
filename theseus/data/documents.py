"""Documents: the texts of a corpus, in bounded batches, whatever form it is held in.

``text`` and ``stdlib``: each file is one document (``.gz`` and ``.zst`` decompressed).
``jsonl``, ``parquet``, ``arrow``: each row is one, its ``data.text_field`` (other fields ignored).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

from theseus.config import ConfigError
from theseus.data.config import DataConfig
from theseus.data.corpus_files import read_text
from theseus.data.records import Batch, missing_field, read_batches
from theseus.data.records import SOURCES as RECORDS

KINDS = {"int": "a number", "float": "a number", "bool": "a boolean", "list": "a list", "dict": "an object"}
CHUNK_BYTES = 1 << 20  # bytes (on disk, and of text) gathered per batch: one encode_batch call


@dataclasses.dataclass(frozen=True)
class Documents:
    """Consecutive documents; ``done``: bytes on disk read since the previous batch (for progress)."""

    texts: list[str]
    done: int


def documents(cfg: DataConfig, files: list[Path]) -> Iterator[Documents]:
    """``files``' documents (``corpus_files(cfg)``), in order, in batches of about CHUNK_BYTES."""
    texts, done, size = [], 0, 0
    for batch in _file_documents(files) if cfg.source not in RECORDS else _record_documents(cfg, files):
        texts += batch.texts
        done += batch.done
        size += sum(map(len, batch.texts))  # characters: near enough to its bytes to size a batch
        if size >= CHUNK_BYTES or done >= CHUNK_BYTES:
            yield Documents(texts, done)
            texts, done, size = [], 0, 0
    if texts or done:
        yield Documents(texts, done)


def _record_documents(cfg: DataConfig, files: list[Path]) -> Iterator[Documents]:
    for file in files:
        column = None if cfg.source == "jsonl" else cfg.text_field
        done = 0
        for batch in read_batches(file, cfg.source, column):
            yield Documents(_texts(file, batch, cfg.text_field, cfg.source), batch.position - done)
            done = batch.position
        if done < file.stat().st_size:  # what the batches' positions did not count (a file's footer)
            yield Documents([], file.stat().st_size - done)


def _file_documents(files: list[Path]) -> Iterator[Documents]:
    """One document per file."""
    for path in files:
        yield Documents([read_text(path)], path.stat().st_size)


def _texts(file: Path, batch: Batch, field: str, source: str) -> list[str]:
    """The text of each row of ``batch`` (``field`` of each dict for jsonl, the column's values
    otherwise); ConfigError naming the file and row when one has none, or not a string."""
    rows = batch.rows
    if source == "jsonl":
        try:
            rows = [row[field] for row in rows]
        except KeyError:
            number, row = next((n, row) for n, row in zip(batch.numbers, batch.rows, strict=True) if field not in row)
            raise missing_field(f"{file}:{number}", field, list(row)) from None
    if all(type(text) is str for text in rows):
        return rows
    number, value = next((n, v) for n, v in zip(batch.numbers, rows, strict=True) if not isinstance(v, str))
    where = f"{file}:{number}" if source == "jsonl" else f"{file}, row {number},"
    kind = "null" if value is None else KINDS.get(type(value).__name__, f"a {type(value).__name__}")
    raise ConfigError(f"{where} field {field!r} is {kind}, not a string: set data.text_field to a text field, "
                      "or fix or drop that row")
