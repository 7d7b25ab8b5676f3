"""Every line this process writes through Python starting with a label: parallel sweep jobs,
whose worker processes share one console, told apart (``[job 3] step 10/100 loss 2.3``); or
sent elsewhere (``replaced_output``: a sweep job's lines to its own transcript).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Callable, Iterator
from typing import TextIO


class Prefixed(io.TextIOBase):
    """A text stream writing to ``stream`` with ``prefix`` at the start of each line, a whole line
    at a time (lines of processes sharing a console do not interleave); never a terminal, so
    no live progress bar redraws over another job's."""

    def __init__(self, stream: TextIO, prefix: str):
        self.stream, self._prefix, self._at_start = stream, prefix, True

    def write(self, text: str) -> int:
        pieces = []
        for piece in text.splitlines(keepends=True):
            pieces.append(self._prefix + piece if self._at_start else piece)
            self._at_start = piece.endswith(("\n", "\r"))
        self.stream.write("".join(pieces))
        if self._at_start:
            self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return self.stream.encoding


@contextlib.contextmanager
def replaced_output(replace: Callable[[TextIO], TextIO], handlers_to: TextIO | None = None) -> Iterator[None]:
    """Inside, ``sys.stdout`` and ``sys.stderr`` write to ``replace(stream)`` (one per stream), and
    so do the logging handlers writing to them, or to ``handlers_to`` when given; restored after
    (a reused worker's next job has its own)."""
    saved = sys.stdout, sys.stderr
    replaced = {id(stream): replace(stream) for stream in saved}
    handlers = [handler for handler in logging.root.handlers
                if isinstance(handler, logging.StreamHandler) and id(handler.stream) in replaced]
    sys.stdout, sys.stderr = (replaced[id(stream)] for stream in saved)
    olds = [handler.setStream(handlers_to or replaced[id(handler.stream)]) for handler in handlers]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        for handler, old in zip(handlers, olds):
            handler.setStream(old)


def prefixed_output(prefix: str) -> contextlib.AbstractContextManager[None]:
    """Inside, ``sys.stdout``, ``sys.stderr`` and the logging handlers writing to them put
    ``prefix`` before each line; restored after."""
    return replaced_output(lambda stream: Prefixed(stream, prefix))
