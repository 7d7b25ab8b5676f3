"""Corpora in each format researchers hold them: the same rows as JSONL (plain, .gz, .zst), parquet,
and folders written by datasets' save_to_disk (a Dataset's, a DatasetDict's)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import numpy as np
import zstandard

from theseus.data.prepare import split_blocks
from theseus.data.shards import read_meta, read_tokens


DOCS = [{"id": i, "text": text} for i, text in enumerate([
    "First document.\nIt has two lines.",
    "naïve café, 日本語, ✓ — and \"quotes\", \\backslashes\\ and {braces}",
    "",
    "def f(x):\n    return x * 2  # twice\n" * 30,
    "<|endoftext|> written out is text here, not a marker",
])]
FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "dataset", "datasetdict")


def write_corpus(folder: Path, fmt: str, rows: list[dict], field: str = "text") -> tuple[Path, str, str]:
    """``rows`` written in ``fmt`` (one of FORMATS) under ``folder``: ``(data.path, data.source, data.split)``.
    A DatasetDict holds ``rows`` as its ``test`` split, beside a ``train`` split of other rows.
    ``field``: the name their ``text`` is written under."""
    rows = [{(field if key == "text" else key): value for key, value in row.items()} for row in rows]
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
    if fmt.startswith("jsonl"):
        path = folder / f"corpus.{fmt}"
        compress = {"jsonl": bytes, "jsonl.gz": gzip.compress, "jsonl.zst": zstandard.ZstdCompressor().compress}
        path.write_bytes(compress[fmt](lines))
        return path, "jsonl", "train"
    if fmt == "parquet":
        path = folder / "corpus.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)
        return path, "parquet", "train"
    path = folder / fmt
    dataset = datasets.Dataset.from_list(rows)
    if fmt == "dataset":
        dataset.save_to_disk(str(path), num_shards=min(2, len(rows)))
        return path, "arrow", "train"
    other = datasets.Dataset.from_list([{**row, field: f"train {i}"} for i, row in enumerate(rows)])
    datasets.DatasetDict({"train": other, "test": dataset}).save_to_disk(str(path))
    return path, "arrow", "test"


def stream(folder) -> np.ndarray:
    """The token stream prepare() split, put back together from train.bin and val.bin."""
    meta = read_meta(folder)
    tokens = read_tokens(folder, meta)
    total = meta.counts["train"] + meta.counts["val"]
    block, is_val = split_blocks(total, meta.settings["val_fraction"], meta.settings["seed"])
    taken = {"train": 0, "val": 0}
    parts = []
    for to_val in is_val:
        split = "val" if to_val else "train"
        parts.append(tokens[split][taken[split]:taken[split] + block])
        taken[split] += len(parts[-1])
    assert taken == meta.counts
    return np.concatenate(parts)
