"""Corpus sources: the files a ``stdlib`` or ``text`` corpus is made of, and reading them.

``stdlib`` is the running interpreter's own standard library (its ``.py`` files, test suites
and installed packages left out): real code, on every machine, needing no download.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from pathlib import Path

from theseus.config import ConfigError
from theseus.data.config import DataConfig

STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def corpus_files(cfg: DataConfig) -> list[Path]:
    """The corpus's files in a stable order (capped at ``data.max_files``); never empty.

    Raises ConfigError naming ``data.path`` when it is unset, missing, matches nothing, or
    holds only empty files.
    """
    files = stdlib_files() if cfg.source == "stdlib" else text_files(cfg.path)
    files = files[: cfg.max_files]
    where = "the standard library" if cfg.source == "stdlib" else f"data.path={cfg.path}"
    if not files:
        raise ConfigError(f"{where} matches no files: point data.path at a text file, a folder or a glob")
    if all(path.stat().st_size == 0 for path in files):
        raise ConfigError(f"the corpus at {where} is empty ({len(files)} files of 0 bytes): give data.path some text")
    return files


def stdlib_files() -> list[Path]:
    """This interpreter's standard library ``.py`` files, sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(name for name in subfolders if name not in STDLIB_SKIP)
        found += [Path(folder, name) for name in sorted(names) if name.endswith(".py")]
    return found


def text_files(path: str | None) -> list[Path]:
    """The files ``path`` names: a file, every non-hidden file under a folder, or a glob."""
    if path is None:
        raise ConfigError("data.source=text needs data.path: set data.path to a text file, a folder or a glob")
    expanded = os.path.expanduser(path)
    if glob.has_magic(expanded):
        return sorted(Path(p) for p in glob.glob(expanded, recursive=True) if Path(p).is_file())
    root = Path(expanded)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ConfigError(f"data.path={path} does not exist: set data.path to a text file, a folder or a glob")
    return sorted(p for p in root.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))


def read_text(path: Path) -> str:
    """The UTF-8 text of ``path``; ConfigError naming the file when it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}: "
                          "fix its permissions or leave it out of data.path") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}): "
                          "convert it to UTF-8 or leave it out of data.path") from exc
