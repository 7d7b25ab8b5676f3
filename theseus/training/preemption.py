"""Preemption: SIGTERM or SIGINT asks the run to stop at the next step boundary.

The first signal is acknowledged at once on the console (``stopping after step N: saving a
checkpoint``); the trainer then stops after that step, saves a checkpoint, waits for it and
says how to resume. A second signal exits at once, without saving.

Python runs a signal handler only between bytecodes of the main thread, which may be inside a
compiled step or a checkpoint wait for a long time. So the C-level handler also writes the
signal's number to a wakeup pipe (``signal.set_wakeup_fd``) that a watcher thread reads: it
acknowledges the first signal and ends the process on the second whatever the main thread does.
Before the run's first step (``BeforeStart``, around the preflight's compilation) a signal ends
the process at once: nothing has been written.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
    """A context manager; ``requested`` is the signal received, or None.

    ``stop_step(step)``: the step the run will stop after when a signal arrives while step
    ``step + 1`` is under way (the trainer's: the next step whose signals are compared).
    ``step``: the last step whose stop check (``agreed``) has run; a signal and a check are
    ordered by a lock, so the step acknowledged is the step the run stops after.
    """

    def __init__(self, stop_step: Callable[[int], int] = lambda step: step + 1, *,
                 say: Callable[[str], None] | None = None):
        super().__init__()
        self.requested: int | None = None
        self.step: int | None = None  # unknown until the trainer has restored its state
        self._stop_step = stop_step
        self._say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self._received = 0  # signals seen by the watcher (or by the handler, without one)
        self._lock = threading.Lock()

    def _signal(self, signum: int) -> None:
        """A signal arrived: the first is acknowledged, the second exits the process now."""
        with self._lock:
            self._received += 1
            first, step = self._received == 1, self.step
            if first:
                self.requested = signum
        name = signal.Signals(signum).name
        if first:
            after = "the first step" if step is None else f"step {self._stop_step(step)}"
            self._say(f"theseus: {name} received: stopping after {after}: saving a checkpoint "
                      f"({'Ctrl-C' if signum == signal.SIGINT else name} again exits at once, without saving)")
        else:
            self._say(f"theseus: {name} again: exiting now, without saving")
            _exit_now(signum)

    def agreed(self, step: int, now: bool) -> int | None:
        """The signal to stop on after ``step``, the same in every process (None: go on).

        With several processes the signals are compared only when ``now`` (the trainer's log
        steps): a collective every step would stall the dispatch of the next one.
        """
        with self._lock:
            self.step, requested = step, self.requested
        if jax.process_count() == 1:
            return requested
        if not now:
            return None
        return int(multihost_utils.process_allgather(np.int32(requested or 0)).max()) or None
