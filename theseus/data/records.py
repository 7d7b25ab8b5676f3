"""Records: the rows of a corpus as researchers hold it, read in bounded batches, never whole.

    for row in iter_records([Path("chat.jsonl.zst")], "jsonl"):
        row["messages"]

Sources: ``jsonl`` (one JSON object a line; ``.gz`` and ``.zst`` decompressed as read),
``parquet`` (read with pyarrow, BATCH_ROWS rows at a time; pyarrow holds one row group's
column chunks), ``arrow`` (a folder written by
``datasets.Dataset.save_to_disk``, or a ``DatasetDict``'s, whose ``split`` is read; its Arrow
stream files are read with pyarrow a record batch at a time, through ordinary reads, not a
memory map, so the pages read do not stay in the process's RSS).
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import io
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from theseus.config import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

SOURCES = ("jsonl", "parquet", "arrow")
JSONL_NAMES = (".jsonl", ".ndjson")  # what a jsonl folder's files end with (before .gz/.zst); a glob takes any
COMPRESSED = (".gz", ".zst")
BATCH_ROWS = 256  # rows per batch at most (jsonl, parquet); arrow keeps its files' own batches (datasets: 1000 rows)
BATCH_BYTES = 1 << 20  # JSONL bytes per batch at most: a batch of long documents stays small
STATE, DICT = "state.json", "dataset_dict.json"  # what save_to_disk writes into a Dataset's, a DatasetDict's folder
PARQUET_MAGIC = b"PAR1"  # a parquet file's first (and last) four bytes


@dataclasses.dataclass(frozen=True)
class Batch:
    """Consecutive rows of one file: ``rows`` (dicts, or one column's values), the 1-based line
    (jsonl) or row number of each in ``numbers``, and ``position``: the bytes of the file on disk
    read so far (compressed bytes for a compressed file), for progress."""

    rows: list
    numbers: list[int]
    position: int


def iter_records(paths: Sequence[Path], source: str, split: str = "train") -> Iterator[dict]:
    """Every row of ``paths`` (files, folders or globs; resolved by ``data_files``) as a dict, in order.

    Raises ConfigError naming the file (and line) for a line that is not a JSON object, a file
    that is not of ``source``'s format, or an ``arrow`` folder that save_to_disk did not write.
    """
    for path in paths:
        for file in data_files(str(path), source, split):
            for batch in read_batches(file, source):
                yield from batch.rows


def data_files(path: str, source: str, split: str = "train") -> list[Path]:
    """The data files ``path`` names for ``source``, in a stable order.

    A file is itself; a glob, the files it matches; a folder, its ``.parquet`` files (parquet),
    its ``.jsonl``/``.ndjson`` files, compressed or not (jsonl), every non-hidden file
    (text), or for ``arrow`` the Arrow files save_to_disk listed in its ``state.json`` (a
    DatasetDict's: the ``split`` sub-folder's). ConfigError when ``path`` does not exist.
    """
    expanded = os.path.expanduser(path)
    if glob.has_magic(expanded):
        return sorted(Path(p) for p in glob.glob(expanded, recursive=True) if Path(p).is_file())
    root = Path(expanded)
    if root.is_file():
        if source != "parquet" and _is_parquet(root):
            raise ConfigError(f"data.path={path} is a parquet file, which data.source={source} does not read: "
                              f"use data.source=parquet")
        return [root]
    if not root.is_dir():
        raise ConfigError(f"data.path={path} does not exist: set data.path to a file, a folder or a glob")
    if source == "arrow":
        return arrow_files(root, split)
    if (root / STATE).is_file() or (root / DICT).is_file():
        raise ConfigError(f"data.path={path} is a folder written by datasets' save_to_disk, which "
                          f"data.source={source} does not read: use data.source=arrow")
    files = sorted(p for p in root.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    if source == "parquet":
        return [p for p in files if p.name.endswith(".parquet")]
    if source == "jsonl":
        return [p for p in files if _plain_name(p).endswith(JSONL_NAMES)]
    return files


def _is_parquet(file: Path) -> bool:
    """Whether ``file`` begins as a parquet file does (its magic bytes)."""
    with file.open("rb") as f:
        return f.read(4) == PARQUET_MAGIC


def missing_field(where: str, field: str, fields: Sequence[str], kind: str = "field") -> ConfigError:
    """A row (at ``where``) without ``data.text_field``, whose fields (or columns: ``kind``) are
    ``fields``: the fix is to name the one holding its text, or, rows of ``messages`` being
    conversations, to fine-tune on them."""
    fix = ("rows of messages are conversations, which task=sft reads: add task=sft" if "messages" in fields
           else "set data.text_field to the one holding the text")
    return ConfigError(f"{where} has no {kind} {field!r} (its {kind}s: {', '.join(fields) or 'none'}): {fix}")


def arrow_files(folder: Path, split: str) -> list[Path]:
    """The Arrow files of the Dataset save_to_disk wrote in ``folder`` (a DatasetDict's: its
    ``split``); ConfigError for a folder of another layout or a split it lacks."""
    if (folder / DICT).is_file():
        splits = _json(folder / DICT).get("splits", [])
        if split not in splits:
            raise ConfigError(f"{folder} is a DatasetDict of splits {', '.join(map(str, splits))}, not {split!r}: "
                              f"set data.split to one of them")
        folder = folder / split
    if not (folder / STATE).is_file():
        raise ConfigError(f"{folder} is not a folder written by datasets' save_to_disk (it has no {STATE} or {DICT}): "
                          "point data.path at one, or use data.source=parquet or jsonl for other files")
    entries = _json(folder / STATE).get("_data_files")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "filename" in e for e in entries):
        raise ConfigError(f"{folder / STATE} lists no _data_files: save the dataset again with save_to_disk")
    files = [folder / e["filename"] for e in entries]
    for file in files:
        if not file.is_file():
            raise ConfigError(f"{file} is missing ({folder / STATE} lists it): "
                              "save the dataset again with save_to_disk")
    return files


def read_batches(file: Path, source: str, column: str | None = None) -> Iterator[Batch]:
    """The rows of one data file in batches; with ``column`` (parquet, arrow), that column's
    values only (ConfigError listing the columns when it is absent)."""
    if source == "jsonl":
        yield from _jsonl_batches(file)
    elif source == "parquet":
        yield from _parquet_batches(file, column)
    elif source == "arrow":
        yield from _arrow_batches(file, column)
    else:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")


def open_binary(path: Path) -> tuple[BinaryIO, BinaryIO]:
    """``(decompressed, raw)``: a buffered reader of ``path``'s bytes (``.gz`` and ``.zst``
    decompressed) and the raw file under it, whose ``tell()`` counts the bytes read from disk."""
    raw = path.open("rb")
    if path.name.endswith(".gz"):
        return io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), 1 << 20), raw
    if path.name.endswith(".zst"):
        import zstandard  # here: only a .zst file needs it

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True),
                                 1 << 20), raw
    return io.BufferedReader(raw, 1 << 20), raw


def _jsonl_batches(file: Path) -> Iterator[Batch]:
    """A JSONL file's objects, BATCH_ROWS or BATCH_BYTES at a time (blank lines skipped)."""
    stream, raw = open_binary(file)
    with stream, raw:
        rows, numbers, size = [], [], 0
        try:
            for number, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                    raise ConfigError(f"{file}:{number} is not JSON ({reason}): each line of a JSONL file holds one "
                                      "JSON object; fix or drop that line") from exc
                if not isinstance(row, dict):
                    raise ConfigError(f"{file}:{number} is a JSON {type(row).__name__}, not an object: each line of a "
                                      'JSONL file holds one object such as {"text": "..."}')
                rows.append(row)
                numbers.append(number)
                size += len(line)
                if len(rows) == BATCH_ROWS or size >= BATCH_BYTES:
                    yield Batch(rows, numbers, raw.tell())
                    rows, numbers, size = [], [], 0
        except (OSError, EOFError) as exc:
            raise ConfigError(f"{file} cannot be read ({exc}): a truncated or corrupt compressed file? "
                              "write it again, or leave it out of data.path") from exc
        yield Batch(rows, numbers, raw.tell())


def _parquet_batches(file: Path, column: str | None) -> Iterator[Batch]:
    import pyarrow as pa  # here, not at the top: a run of another source does not load pyarrow
    import pyarrow.parquet as pq

    try:
        reader = pq.ParquetFile(file)
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(f"{file} is not a parquet file ({exc}): leave it out of data.path, "
                          "or set data.source to its format") from exc
    columns = _checked_column(file, reader.schema_arrow, column)
    size, total, done = file.stat().st_size, max(reader.metadata.num_rows, 1), 0
    with reader:
        for batch in reader.iter_batches(batch_size=BATCH_ROWS, columns=columns):
            yield _batch(batch, column, done, size * (done + batch.num_rows) // total)
            done += batch.num_rows


def _arrow_batches(file: Path, column: str | None) -> Iterator[Batch]:
    import pyarrow as pa

    size = file.stat().st_size
    try:
        with pa.OSFile(str(file)) as raw, pa.ipc.open_stream(raw) as reader:
            columns = _checked_column(file, reader.schema, column)
            done = 0
            for batch in reader:
                batch = batch.select(columns) if columns else batch
                yield _batch(batch, column, done, min(raw.tell(), size))
                done += batch.num_rows
    except pa.ArrowInvalid as exc:
        raise ConfigError(f"{file} is not an Arrow stream as save_to_disk writes ({exc}): "
                          "save the dataset again with save_to_disk") from exc


def check_text_field(files: Sequence[Path], source: str, field: str) -> None:
    """ConfigError naming the first file of ``files`` without ``field``, before anything is
    prepared: a parquet or arrow file's schema is read (no row), a jsonl file's first row (the
    others say so when they are read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for file in files:
        try:
            if source == "jsonl":
                first = next(_jsonl_batches(file))
                if first.rows and field not in first.rows[0]:
                    raise missing_field(f"{file}:{first.numbers[0]}", field, list(first.rows[0]))
            elif source == "parquet":
                _checked_column(file, pq.read_schema(file), field)
            elif source == "arrow":
                with pa.OSFile(str(file)) as raw, pa.ipc.open_stream(raw) as reader:
                    _checked_column(file, reader.schema, field)
        except (pa.ArrowException, OSError):
            continue  # not of its format: said where its rows are read


def _checked_column(file: Path, schema: pa.Schema, column: str | None) -> list[str] | None:
    if column is not None and column not in schema.names:
        raise missing_field(str(file), column, schema.names, kind="column")
    return None if column is None else [column]


def _batch(batch: pa.RecordBatch, column: str | None, first: int, position: int) -> Batch:
    rows = batch.to_pylist() if column is None else batch.column(0).to_pylist()
    return Batch(rows, list(range(first + 1, first + 1 + batch.num_rows)), position)


def _plain_name(path: Path) -> str:
    """``path``'s name without a trailing .gz or .zst."""
    name = path.name
    return name[: -len(name.rsplit(".", 1)[1]) - 1] if name.endswith(COMPRESSED) else name


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} does not parse as JSON ({exc}): save the dataset again with save_to_disk") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object: save the dataset again with save_to_disk")
    return data
