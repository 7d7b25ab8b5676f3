"""Corpus sources: the files a corpus is made of (``stdlib``, ``text``, or records: ``jsonl``,
``parquet``, ``arrow``), and reading a text file whole.

``stdlib`` is the running interpreter's own standard library (its ``.py`` files, test suites
and installed packages left out): real code, on every machine, needing no download.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from theseus.config import ConfigError
from theseus.data.config import DataConfig
from theseus.data.records import data_files, open_binary

STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def corpus_files(cfg: DataConfig) -> list[Path]:
    """The corpus's files in a stable order (capped at ``data.max_files``); never empty.

    Raises ConfigError naming ``data.path`` when it is unset, missing, matches nothing, or
    holds only empty files.
    """
    if cfg.source == "stdlib":
        files = stdlib_files()
    elif cfg.path is None:
        raise ConfigError(f"data.source={cfg.source} needs data.path: set data.path to a file, a folder or a glob")
    else:
        files = data_files(cfg.path, cfg.source, cfg.split)
    files = files[: cfg.max_files]
    where = "the standard library" if cfg.source == "stdlib" else f"data.path={cfg.path}"
    if not files:
        kind = {"jsonl": ".jsonl or .ndjson (.gz, .zst)", "parquet": ".parquet"}.get(cfg.source, "text")
        raise ConfigError(f"{where} matches no {kind} files: point data.path at a file, a folder or a glob")
    if all(path.stat().st_size == 0 for path in files):
        raise ConfigError(f"the corpus at {where} is empty ({len(files)} files of 0 bytes): give data.path some text")
    return files


def rows_files(data: DataConfig, task: str, rows: str, sources: tuple[str, ...], use: str) -> list[Path]:
    """The files of ``data``'s one source of ``rows`` that ``task=TASK`` reads (``corpus_files``);
    ConfigError for a mixture, or a source not among ``sources`` (``use``: which to use, in words)."""
    if data.mixture:
        raise ConfigError(f"task={task} reads one source of {rows}: drop data.mixture, set data.source and data.path")
    if data.source not in sources:
        raise ConfigError(f"task={task} reads {rows}, not data.source={data.source}: use data.source={use}")
    return corpus_files(data)


def stdlib_files() -> list[Path]:
    """This interpreter's standard library ``.py`` files, sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(name for name in subfolders if name not in STDLIB_SKIP)
        found += [Path(folder, name) for name in sorted(names) if name.endswith(".py")]
    return found


def read_text(path: Path) -> str:
    """The UTF-8 text of ``path`` (``.gz``, ``.zst`` decompressed); ConfigError naming the file
    when it cannot be read."""
    try:
        stream, raw = open_binary(path)
        with stream, raw:
            data = stream.read()
    except (OSError, EOFError) as exc:
        raise ConfigError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}: "
                          "fix its permissions or leave it out of data.path") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}): "
                          "convert it to UTF-8 or leave it out of data.path") from exc
