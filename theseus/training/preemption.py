"""Preemption: SIGTERM or SIGINT asks the run to stop at the next step boundary.

The trainer then saves a checkpoint, waits for it and exits with a message saying how to
resume. A second signal exits at once.
"""

from __future__ import annotations

import os
import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
    """A context manager; ``requested`` is the signal received, or None."""

    def __init__(self):
        self.requested: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame) -> None:
        if self.requested is not None:  # the second signal: no more waiting
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.requested = signum

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def agreed(self, now: bool) -> int | None:
        """The signal to stop on, the same in every process (None: go on).

        With several processes the signals are compared only when ``now`` (the trainer's log
        steps): a collective every step would stall the dispatch of the next one.
        """
        if jax.process_count() == 1:
            return self.requested
        if not now:
            return None
        return int(multihost_utils.process_allgather(np.int32(self.requested or 0)).max()) or None
