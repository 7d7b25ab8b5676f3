"""Profiler: a ``jax.profiler`` trace of a chosen range of training steps.

``trainer.profile_steps=[START, END]`` traces steps START..END (1-based, inclusive) into
``RUN/profile/``; open it with TensorBoard's profile plugin (XProf) or Perfetto (see the
README). Unset, ``on_step`` returns at once: no trace, no wait on the device.

The trace holds the runtime's and the device's events, not every Python call: JAX's Python
tracer is off. It would record each call of every thread (the data loader's, the checkpointer's),
installing itself into those threads while they run: the likely cause of a profiled run's
segfault that CI met once here (Levanter's profiler callback reports the same around a trace's
start and stop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

_OPTIONS = jax.profiler.ProfileOptions()
_OPTIONS.python_tracer_level = 0  # no Python tracer (see the module)


class Profiler:
    """Starts a trace before step START runs and stops it once step END has finished.

    ``on_step(step, state)`` is called before each step is dispatched, with the state the
    previous step returned (waiting on it is how the trace is made to hold every device op of
    the traced steps, and nothing of the step after). ``close(state)`` ends a trace still open.
    """

    def __init__(self, steps: Sequence[int] | None, directory: Path, report: Callable[[str], None] = print):
        """``steps``: ``[START, END]`` (TrainerConfig checked them) or None: off. ``report``
        says where the trace went once it is written."""
        self.start, self.end = (steps[0], steps[1]) if steps is not None else (0, -1)
        self.directory = directory
        self.tracing = False
        self._report = report
        self._last = 0  # the last step dispatched

    def on_step(self, step: int, state: Any) -> None:
        self._last = step
        if step == self.start:
            jax.block_until_ready(state)  # the steps before are not traced
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.directory), profiler_options=_OPTIONS)
            self.tracing = True
        elif step == self.end + 1:
            self.close(state)

    def close(self, state: Any) -> None:
        if self.tracing:
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.tracing = False
            self._report(f"profile of steps {self.start}-{min(self.end, self._last)} written to {self.directory} "
                         f"(open it with TensorBoard's profile plugin or Perfetto)")
