"""A process of its own that writes a run's checkpoints, so that a save costs the step loop one
copy of the state to the host, in its pause, and nothing while it is written.

Orbax writes in background threads of the process that saves: their Python holds the GIL in
bursts, their files and buffers go through the same process's kernel state. Beside a step of a few
milliseconds that shows: gpt_small on a TPU v5e (3.2 ms steps, checkpoints every 50), 17 of its 29
windows of 10 steps ran at 0.08-0.70 of the others' speed while they wrote. Where one process
drives an accelerator (``writes_in_own_process``), ``Checkpointer`` hands its saves to this writer
instead:

    the loop's process (this module)                the writer (``checkpoint_server``, on the CPU)
    the state copied on its devices (``snapshot``)
    device_get(copy) -> shared memory               maps the same memory
    pipe: step, layout, JSON items  ------------->  Checkpointer(writer="threads").write, wait
                                    <-------------  ("saved", step) or ("failed", step, why)

The state reaches the host before ``save`` returns, in the hook's pause, from a copy of it on its
devices made for the save; that copy, its buffers and the host copy JAX keeps on it, is deleted
before the writer is sent the save. Each part was measured on the v5e (gpt_small, 125 MiB, the
window of 10 steps after each save against the median window):

- a thread moving the copy to the host beside the steps: 0.26-0.45 (a transfer stalls the steps
  beside it by about its own length, 0.1 s);
- the copy moved in the pause and left for Python to free: 0.80-0.87, as much with 0.3 s more
  pause after the save or the writer at the lowest priority, but 0.99-1.01 with the writer not
  writing: its 125 MiB were freed beside the next steps (not at once, whatever the pause's
  length), while the writer was writing the checkpoint (why the two together cost that: not
  traced);
- the same with the copy deleted before the writer starts (this module): 0.98-1.02, and the
  accelerator check's ``-k main_job`` passed.

The live state moved to the host costs as much (0.79-0.85): its host copy lives on the array
until the next step replaces it. The device copy costs one pass over the state's bytes (~0.3 ms
at 819 GB/s); where the devices' memory cannot hold it beside the steps' peak (judged at the
first save), the live state is moved instead, at that cost.

The writer and its shared memory are made once, before the loop's first step (``prepare``: every
save of a run holds the same arrays); the memory is written again only after the writer has
answered for the save before, so a save waits on the writer only while the one before it is being
written. The writer runs in a process group of its own (``setsid``: a terminal's Ctrl-C reaches
the run, not it) and ignores SIGINT and SIGTERM (a cluster's stop signal may reach every process
of the job: the writer must outlive it to write the stop's checkpoint), exits when the pipe closes
(``close``), and is killed with the loop's process (``PR_SET_PDEATHSIG``): as Orbax's threads
would be, so that a run started again at once never meets a writer of the last one; the checkpoint
it was writing is absent, never partial (Orbax writes to a temporary folder and renames it when
whole).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ALIGN = 64  # bytes: each array's offset in the shared memory
SERVER = "theseus.training.checkpoint_server"  # the writer's side, run as python -m


def writes_in_own_process() -> bool:
    """Whether a run's saves pay for a writer process: one process, on an accelerator (a CPU's
    steps take long enough to hide Orbax's threads, and its cores would run the writer's)."""
    return jax.process_count() == 1 and jax.default_backend() != "cpu" and hasattr(os, "memfd_create")  # Linux


def room_for_a_copy(leaves: list[Any], stats: Callable[[jax.Device], dict | None] = jax.Device.memory_stats) -> bool:
    """Whether every device the state lies on holds a second copy of its share beside the peak its
    memory has reached (``stats``: the step's temporaries included); a device that keeps no
    statistics (a CPU's memory is the host's) is taken to."""
    need: dict[jax.Device, int] = {}
    for leaf in leaves:
        if isinstance(leaf, jax.Array):
            shard = math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
            for device in leaf.sharding.device_set:
                need[device] = need.get(device, 0) + shard
    for device, size in need.items():
        held = stats(device)
        if held and held["bytes_limit"] - held["peak_bytes_in_use"] < size:
            return False
    return True


@jax.jit
def snapshot(leaves: list[Any]) -> list[Any]:
    """A copy of ``leaves`` in device memory, laid out as they are (new buffers: nothing is
    donated), to be moved to the host and dropped within the save. Compiled by
    ``WriterProcess.prepare`` before the loop's first step."""
    return [jnp.copy(leaf) for leaf in leaves]


def layout(leaves: list[Any]) -> tuple[list[tuple[int, tuple[int, ...], np.dtype]], int]:
    """Where each array (host or device, or number) lies in the shared memory: ``[(offset, shape,
    dtype)], total bytes``."""
    places, end = [], 0
    for leaf in leaves:
        shape, dtype = np.shape(leaf), np.dtype(leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype)
        places.append((end, shape, dtype))
        end += -(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN
    return places, max(end, ALIGN)


def views(memory: mmap.mmap, places: list[tuple[int, tuple[int, ...], np.dtype]]) -> list[np.ndarray]:
    """The arrays ``places`` describes, as views of ``memory`` (no copy)."""
    return [np.frombuffer(memory, dtype, int(np.prod(shape)), offset).reshape(shape) for offset, shape, dtype in places]


class WriterProcess:
    """The loop's side: starts the writer (``prepare``, else at the first save), sends it each
    save, collects its answers."""

    def __init__(self, directory: Path, keep: int):
        self.directory, self.keep = directory, keep
        self.process: subprocess.Popen | None = None
        self.memory: mmap.mmap | None = None
        self.places: list = []  # the saves' arrays in the shared memory (``layout``)
        self.shardings: tuple = ()  # and on the devices: what the copy was compiled for
        self.copy: Callable[[list[Any]], list[Any]] | None = None  # snapshot, compiled for those arrays
        self.room: bool | None = None  # whether the devices hold the copy: decided at the first save
        self.pending: int | None = None  # the step sent and not yet answered for

    def prepare(self, state: Any) -> None:
        """Start the writer, make the shared memory and compile the copy on the devices for saves
        of ``state``'s arrays: what the first save would otherwise do between two steps."""
        leaves = jax.tree.leaves(state)
        places, size = layout(leaves)
        shardings = tuple(getattr(leaf, "sharding", None) for leaf in leaves)
        if self.process is None or (places, shardings) != (self.places, self.shardings):
            self.close()
            self._start(size)
            self.places, self.shardings, self.room = places, shardings, None
            on_devices = any(isinstance(leaf, jax.Array) for leaf in leaves)
            self.copy = snapshot.lower(leaves).compile() if on_devices else None

    def save(self, step: int, state: Any, items: dict[str, Any], metrics: dict | None) -> None:
        """Copy ``state`` (host or device arrays) into the shared memory, by way of a copy on its
        devices where they hold one, and send the writer the save. Waits only for the save before
        (raising if it failed)."""
        leaves, treedef = jax.tree.flatten(state)
        self.wait()
        self.prepare(state)
        if self.room is None:  # once the steps have run (their peak known), before a copy counts in it
            self.room = self.copy is not None and room_for_a_copy(leaves)
        if self.room:
            copy = self.copy(leaves)
            self._fill(jax.device_get(copy))
            for array in copy:  # its buffers and host copy freed now, before the writer starts
                array.delete()
        else:
            self._fill(jax.device_get(leaves))
        try:
            self._send(("save", step, self.places, treedef, items, metrics))
        except BrokenPipeError:
            code = self.process.wait()
            raise RuntimeError(f"the checkpoint writer process ended (exit code {code}) before checkpoint {step} "
                               f"under {self.directory} could be handed to it") from None
        self.pending = step

    def _fill(self, leaves: list[Any]) -> None:
        """``leaves`` (host arrays or numbers) copied into the shared memory; no view of it outlives
        this call (a view held, by a traceback's frame as well, keeps the memory from closing)."""
        for target, leaf in zip(views(self.memory, self.places), leaves, strict=True):
            np.copyto(target, np.asarray(leaf))

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
        """Let the writer finish and exit (its pipe closed), and free the shared memory; a save sent
        and not yet answered for is written first, its answer not read."""
        self.pending = None
        if self.process is not None:
            with contextlib.suppress(BrokenPipeError):  # a writer that died: its save in flight is lost (wait says so)
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
            command = [sys.executable, "-m", SERVER, str(os.getpid()), str(fd), str(size)]
            self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            pass_fds=(fd,), start_new_session=True)  # no terminal's Ctrl-C
        finally:
            os.close(fd)
        self._send(("open", str(self.directory), self.keep))

    def _send(self, message: tuple) -> None:
        pickle.dump(message, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.process.stdin.flush()
