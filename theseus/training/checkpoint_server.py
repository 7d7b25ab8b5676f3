"""The checkpoint writer process's side (``python -m theseus.training.checkpoint_server PARENT
FD SIZE``, started by ``checkpoint_writer.WriterProcess``): it maps the loop's shared memory,
saves what the pipe on stdin sends with Orbax, and answers each save on stdout."""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import sys
from pathlib import Path

import jax

from theseus.training.checkpoint import Checkpointer
from theseus.training.checkpoint_writer import views

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def serve(fd: int, size: int) -> None:
    """The writer: saves what the pipe on stdin sends, answering each on the stdout it was given."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else printed goes to stderr, not into the answers
    memory = mmap.mmap(fd, size)
    requests = sys.stdin.buffer
    _, directory, keep = pickle.load(requests)
    checkpointer = Checkpointer(Path(directory), keep, writer="threads")
    try:
        while True:
            try:
                _, step, places, treedef, items, metrics = pickle.load(requests)
            except EOFError:
                return
            try:
                checkpointer.write(step, jax.tree.unflatten(treedef, views(memory, places)), items, metrics)
                checkpointer.wait()
                answer = ("saved", step)
            except Exception as exc:  # noqa: BLE001 - the loop's process reports it
                answer = ("failed", step, f"{type(exc).__name__}: {exc}")
            pickle.dump(answer, answers)
            answers.flush()
    finally:
        checkpointer.close()


def _tied_to(parent: int) -> None:
    """This process killed with ``parent`` (Linux's ``PR_SET_PDEATHSIG``), deaf to the signals
    that ask a run to stop."""
    import ctypes

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


if __name__ == "__main__":
    _tied_to(int(sys.argv[1]))
    serve(int(sys.argv[2]), int(sys.argv[3]))
