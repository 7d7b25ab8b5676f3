"""The cache of prepared corpora: one folder per source, tokenizer and settings, built atomically.

A folder is built under a temporary name and renamed into place when complete, so a reader
sees a whole folder or none; an interrupted build leaves only a ``NAME.tmp-HOST-PID`` folder,
removed by the next build on that host.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from theseus.data.config import DataConfig
from theseus.data.gguf_file import is_gguf, open_gguf
from theseus.data.records import SOURCES as RECORDS
from theseus.data.tokenizer import NAMES, TRANSFORMERS_CONFIG

FORMAT = 1  # bump when the shard layout or the tokenization changes


def settings(cfg: DataConfig, files: list[Path]) -> dict:
    """What a prepared corpus depends on; ``fingerprint`` covers each file's path, size and mtime,
    and the content of a tokenizer.json (and of the tokenizer_config.json beside it, which names
    its end-of-document token) or a GGUF file's header (its metadata: the tokenizer; not its
    weights); a record source's text_field and split."""
    tokenizer = cfg.tokenizer if cfg.tokenizer in NAMES else str(Path(cfg.tokenizer).expanduser().resolve())
    fingerprint = hashlib.sha256()
    for path in files:
        stat = path.stat()
        fingerprint.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    if cfg.tokenizer not in NAMES:
        fingerprint.update(_tokenizer_bytes(Path(tokenizer)))
        beside = Path(tokenizer).with_name(TRANSFORMERS_CONFIG)
        if beside.is_file():
            fingerprint.update(beside.read_bytes())
    rows = {"text_field": cfg.text_field, "split": cfg.split} if cfg.source in RECORDS else {}
    return {
        **rows,
        "format": FORMAT,
        "source": cfg.source,
        "tokenizer": tokenizer,
        "bpe_vocab_size": cfg.bpe_vocab_size if cfg.tokenizer == "bpe" else None,
        "val_fraction": cfg.val_fraction,
        "seed": cfg.seed,
        "files": len(files),
        "fingerprint": fingerprint.hexdigest(),
    }


def _tokenizer_bytes(path: Path) -> bytes:
    """What of a tokenizer file tokenizes: a tokenizer.json whole, a GGUF file's header."""
    if not is_gguf(path):
        return path.read_bytes()
    with path.open("rb") as file:
        return file.read(open_gguf(path).header_size)


def cache_folder(cfg: DataConfig, recorded: dict) -> Path:
    """``data.cache_dir/SOURCE-TOKENIZER-DIGEST`` for the ``settings()`` of a corpus."""
    digest = hashlib.sha256(json.dumps(recorded, sort_keys=True).encode()).hexdigest()[:16]
    label = cfg.tokenizer if cfg.tokenizer in NAMES else "json"
    return Path(cfg.cache_dir).expanduser() / f"{cfg.source}-{label}-{digest}"


@contextlib.contextmanager
def building(folder: Path) -> Iterator[Path]:
    """Yield an empty scratch folder that becomes ``folder`` when the block succeeds.

    On an error the scratch folder, and any parent made for it, is removed: nothing is left.
    When another process completed ``folder`` first, its folder is kept and ours dropped.
    """
    _remove_stale(folder)
    scratch = folder.with_name(f"{folder.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    made = [parent for parent in reversed(scratch.parents) if not parent.exists()]
    scratch.mkdir(parents=True)
    try:
        yield scratch
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        for parent in reversed(made):
            with contextlib.suppress(OSError):
                parent.rmdir()
        raise
    for path in scratch.iterdir():  # on disk before the rename makes them visible
        with path.open("rb") as f:
            os.fsync(f.fileno())
    try:
        os.rename(scratch, folder)
    except OSError:
        if not folder.is_dir():
            raise
        shutil.rmtree(scratch, ignore_errors=True)


def _remove_stale(folder: Path) -> None:
    """Remove scratch folders of ``folder`` left by dead processes of this host."""
    host = socket.gethostname()
    for scratch in folder.parent.glob(f"{folder.name}.tmp-*"):
        owner, _, pid = scratch.name.partition(".tmp-")[2].rpartition("-")
        if owner == host and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(scratch, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return True
