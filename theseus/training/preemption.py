"""Preemption: SIGTERM, SIGUSR2 or SIGINT asks the run to stop at the next step boundary.

The first signal is acknowledged at once on the console (``stopping after step N: saving a
checkpoint``); the trainer then stops after that step, saves a checkpoint, waits for it and
says how to resume. A scheduler's signals may repeat while that save is under way (SLURM sends
SIGTERM twice at a time limit, ``scancel`` signals every process of the job): a repeated SIGTERM
or SIGUSR2 is acknowledged and the save goes on. Only a second SIGINT (a person's second
Ctrl-C) exits at once, without saving.

SIGUSR2 is SLURM's warning that the job's time runs out (submitit asks for it with
``--signal=USR2@signal_delay_s``): once the checkpoint of the stop is written, process 0
requeues the job (``scontrol requeue``), which runs the same command again: it resumes from that
checkpoint. Requeueing only after the save matters: ``scontrol requeue`` SIGTERMs the job at once.

With several processes the stop step is agreed every step, without waiting: each step every
process adds its flag (the signal it received, or 0) to a tiny all-reduce dispatched beside the
step, and reads the one dispatched ``LAG`` steps earlier (finished by then, as its step is). All
processes read the same values at the same step, so they stop after the same one, at most
``LAG + 1`` steps after the signal, whatever ``trainer.log_every`` is.

Python runs a signal handler only between bytecodes of the main thread, which may be inside a
compiled step or a checkpoint wait for a long time. So the C-level handler also writes the
signal's number to a wakeup pipe (``signal.set_wakeup_fd``) that a watcher thread reads: it
acknowledges the first signal and ends the process on the second whatever the main thread does.
Before the run's first step (``BeforeStart``, around the preflight's compilation) a signal ends
the process at once: nothing has been written.
"""

from __future__ import annotations

import collections
import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

TIME_LIMIT = signal.SIGUSR2  # SLURM's warning before the time limit (submitit's --signal=USR2@delay)
SIGNALS = (signal.SIGTERM, signal.SIGINT, TIME_LIMIT)
LAG = 1  # with several processes: the flags read each step are those of LAG steps before


class SignalWatch:
    """Within the block, SIGTERM and SIGINT go to ``_signal(signum)``, called at once from a
    watcher thread whatever the main thread does (outside the main thread: nothing changes)."""

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}
        self._wakeup: tuple[int, int] | None = None
        self._previous_fd = -1

    def _signal(self, signum: int) -> None:
        raise NotImplementedError

    def _handle(self, signum: int, frame) -> None:
        if self._wakeup is None:  # no watcher thread: the handler acts
            self._signal(signum)

    def _watch(self, read_fd: int) -> None:
        """Read signal numbers off the wakeup pipe until its write end closes."""
        try:
            while data := os.read(read_fd, 64):
                for signum in data:
                    if signum in SIGNALS:
                        self._signal(signum)
        finally:
            os.close(read_fd)

    def __enter__(self) -> SignalWatch:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C handler must never block
        try:
            self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:
            os.close(read_fd)
            os.close(write_fd)
            return self
        self._wakeup = (read_fd, write_fd)
        threading.Thread(target=self._watch, args=(read_fd,), name="theseus-signals", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_fd)
            read_fd, write_fd = self._wakeup
            os.close(write_fd)  # the watcher's read returns empty: it ends
            self._wakeup = None


def _exit_now(signum: int) -> None:
    """End the process as that signal would (the shell's code 128 + signum), streams flushed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


class BeforeStart(SignalWatch):
    """Before the run's first step (its compilation, say) a signal ends the process at once, in
    one line: there is nothing to save, and nothing has been written."""

    def _signal(self, signum: int) -> None:
        print(f"theseus: interrupted by {signal.Signals(signum).name} before the first step: nothing saved",
              file=sys.stderr, flush=True)
        _exit_now(signum)


class Preemption(SignalWatch):
    """A context manager; ``requested`` is the first signal received, or None.

    ``stop_step(step)``: the step the run will stop after when a signal arrives while step
    ``step + 1`` is under way (``stop_after``, unless given). ``step``: the last step whose stop
    check (``agreed``) has run; a signal and a check are ordered by a lock, so the step
    acknowledged is the step the run stops after. On leaving the block without an error after a
    stop on SIGUSR2 (a time limit), process 0 of a SLURM job requeues it (``requeue``).
    """

    def __init__(self, stop_step: Callable[[int], int] | None = None, *,
                 say: Callable[[str], None] | None = None):
        super().__init__()
        self.requested: int | None = None
        self.stopped: int | None = None  # the signal agreed on (``agreed`` returned it)
        self.step: int | None = None  # unknown until the trainer has restored its state
        self._stop_step = stop_step or self.stop_after
        self._say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self._received = 0  # signals seen by the watcher (or by the handler, without one)
        self._lock = threading.Lock()
        self._flags: collections.deque[jax.Array] = collections.deque()  # several processes: in flight

    @staticmethod
    def stop_after(step: int) -> int:
        """The step a run stops after when signalled while step ``step + 1`` is under way: that
        one, or with several processes ``LAG`` steps later (when its flag is read)."""
        return step + 1 + (LAG if jax.process_count() > 1 else 0)

    def _signal(self, signum: int) -> None:
        """A signal arrived: the first is acknowledged; a second SIGINT exits the process now,
        another repeated signal (a scheduler's) lets the save go on."""
        with self._lock:
            self._received += 1
            first, step = self._received == 1, self.step
            if first:
                self.requested = signum
        name = signal.Signals(signum).name
        if first:
            after = "the first step" if step is None else f"step {self._stop_step(step)}"
            again = " (Ctrl-C again exits at once, without saving)" if signum == signal.SIGINT else ""
            self._say(f"theseus: {name} received: stopping after {after}: saving a checkpoint{again}")
        elif signum == signal.SIGINT:
            self._say(f"theseus: {name} again: exiting now, without saving")
            _exit_now(signum)
        else:
            self._say(f"theseus: {name} received: still stopping, the checkpoint is being saved")

    def agreed(self, step: int) -> int | None:
        """The signal to stop on after ``step``, the same in every process (None: go on).

        Called once after every step. One process: the signal received. Several: the flags
        all-reduced ``LAG`` steps ago.
        """
        with self._lock:
            self.step, requested = step, self.requested
        if jax.process_count() > 1:
            self._flags.append(_any_process(requested or 0))
            oldest = self._flags.popleft() if len(self._flags) > LAG else 0
            requested = int(oldest) or None
        if requested is not None:
            self.stopped = requested
        return requested

    def __exit__(self, exc_type, exc, tb) -> None:
        super().__exit__(exc_type, exc, tb)  # signals go back to their handlers (submitit's) first
        if exc_type is None and self.stopped == TIME_LIMIT and jax.process_index() == 0:
            requeue(self._say)


def _any_process(flag: int) -> jax.Array:
    """The largest of every process's ``flag``, dispatched as a tiny all-reduce (not waited for)."""
    sharding = _every_device()
    local = np.full(len(jax.local_devices()), flag, np.int32)
    return _max(jax.make_array_from_process_local_data(sharding, local, (jax.device_count(),)))


@functools.cache
def _every_device() -> NamedSharding:
    """One element on each device of every process: ``[device_count]``."""
    return NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("p",)), PartitionSpec("p"))


@jax.jit
def _max(flags: jax.Array) -> jax.Array:
    return flags.max()


def slurm_job() -> str | None:
    """This process's SLURM job as ``scontrol`` names it (an array task: ``ARRAY_TASK``), else None."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID")


def requeue(say: Callable[[str], None]) -> None:
    """Requeue this SLURM job (after its time-limit checkpoint is written): SLURM runs it again,
    and the same command resumes from that checkpoint. Outside SLURM: nothing to do."""
    job = slurm_job()
    if job is None:
        return
    proc = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    if proc.returncode == 0:
        say(f"theseus: requeued SLURM job {job}: it resumes from this checkpoint when SLURM starts it again")
    else:
        say(f"theseus: scontrol requeue {job} failed ({proc.stderr.strip()}): run the same command again "
            f"to resume from this checkpoint")
