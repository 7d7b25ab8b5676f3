"""A process of its own that writes a run's checkpoints, so that a save costs the step loop one
copy of the state to host memory and nothing while it is written.

Orbax writes in background threads of the process that saves: their Python holds the GIL in
bursts, their files and buffers go through the same process's kernel state. Beside a step of a
few milliseconds that shows: gpt_small on a TPU v5e (4.6 ms steps, checkpoints every 50) ran
the 10 steps after each save at 6-11x their time, and eight later windows at 1.4-4x, while they wrote.
Where one process drives an accelerator (``writes_in_own_process``), ``Checkpointer`` hands
its saves to this writer instead:

    the loop's process                              the writer (``python -m`` this module, on the CPU)
    device_get(state) -> shared memory (memfd)      maps the same memory
    pipe: step, arrays' layout, JSON items  ---->   Checkpointer(writer="threads").write, wait
                                            <----   ("saved", step) or ("failed", step, why)

The shared memory is made once (every save of a run holds the same arrays) and written again
only after the writer has answered for the save before, so a save never waits on the writer
unless the one before it is still being written. The writer ignores SIGINT and SIGTERM (a
run's stop signal reaches its whole process group: the writer must outlive it to write the
stop's checkpoint), exits when the pipe closes (``close``), and is killed with the loop's
process (``PR_SET_PDEATHSIG``): as Orbax's threads would be, so that a run started again at once
never meets a writer of the last one; the checkpoint it was writing is absent, never partial
(Orbax writes to a temporary folder and renames it when whole).
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

ALIGN = 64  # bytes: each array's offset in the shared memory
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def writes_in_own_process() -> bool:
    """Whether a run's saves pay for a writer process: one process, on an accelerator (a CPU's
    steps take long enough to hide Orbax's threads, and its cores would run the writer's)."""
    return jax.process_count() == 1 and jax.default_backend() != "cpu" and hasattr(os, "memfd_create")  # Linux


def layout(leaves: list[np.ndarray]) -> tuple[list[tuple[int, tuple[int, ...], np.dtype]], int]:
    """Where each array lies in the shared memory: ``[(offset, shape, dtype)], total bytes``."""
    places, end = [], 0
    for leaf in leaves:
        places.append((end, leaf.shape, leaf.dtype))
        end += -(-leaf.nbytes // ALIGN) * ALIGN
    return places, max(end, ALIGN)


def views(memory: mmap.mmap, places: list[tuple[int, tuple[int, ...], np.dtype]]) -> list[np.ndarray]:
    """The arrays ``places`` describes, as views of ``memory`` (no copy)."""
    return [np.frombuffer(memory, dtype, int(np.prod(shape)), offset).reshape(shape) for offset, shape, dtype in places]


class WriterProcess:
    """The loop's side: starts the writer at the first save, sends it each save, collects its answers."""

    def __init__(self, directory: Path, keep: int):
        self.directory, self.keep = directory, keep
        self.process: subprocess.Popen | None = None
        self.memory: mmap.mmap | None = None
        self.places: list = []
        self.pending: int | None = None  # the step sent and not yet answered for

    def save(self, step: int, state: Any, items: dict[str, Any], metrics: dict | None) -> None:
        """Copy ``state`` (host or device arrays) into the shared memory and send the writer the
        save; waits only for the writer's answer on the save before (raising if it failed)."""
        leaves, treedef = jax.tree.flatten(state)
        host = [np.asarray(leaf) for leaf in jax.device_get(leaves)]
        places, size = layout(host)
        self.wait()
        if self.process is None or places != self.places:
            self.close()
            self._start(size)
        self.places = places
        for target, leaf in zip(views(self.memory, places), host, strict=True):
            np.copyto(target, leaf)
        self._send(("save", step, places, treedef, items, metrics))
        self.pending = step

    def wait(self) -> None:
        """Block until the writer has answered for every save sent; raise if one failed."""
        if self.pending is None:
            return
        step, self.pending = self.pending, None
        try:
            answer = pickle.load(self.process.stdout)
        except EOFError:
            code = self.process.wait()
            raise RuntimeError(f"the checkpoint writer process ended (exit code {code}) while writing "
                               f"checkpoint {step} under {self.directory}") from None
        if answer[0] == "failed":
            raise RuntimeError(f"checkpoint {step} under {self.directory} could not be written: {answer[2]}")

    def close(self) -> None:
        """Let the writer finish and exit (its pipe closed), and free the shared memory."""
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait()
            self.process.stdout.close()
            self.process = None
        if self.memory is not None:
            self.memory.close()
            self.memory = None

    def _start(self, size: int) -> None:
        fd = os.memfd_create("theseus-checkpoint")
        try:
            os.ftruncate(fd, size)
            self.memory = mmap.mmap(fd, size)
            env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # the chip stays the loop's
            command = [sys.executable, "-m", __name__, str(os.getpid()), str(fd), str(size)]
            self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            pass_fds=(fd,))
        finally:
            os.close(fd)
        self._send(("open", str(self.directory), self.keep))

    def _send(self, message: tuple) -> None:
        pickle.dump(message, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.process.stdin.flush()


def serve(fd: int, size: int) -> None:
    """The writer: saves what the pipe on stdin sends, answering each on the stdout it was given."""
    from theseus.training.checkpoint import Checkpointer

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
