"""The training loop's state between steps, and its log window: the one place time is kept.

``Trainer.run`` takes a step, then runs its hooks (log, preempt, evaluate, checkpoint) on the
``LoopState``; each hook decides with ``LoopState.due`` whether its cadence falls on this step.
A new piece of cadence (a profiler, an extra evaluation) is one more hook.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from theseus.training.checkpoint import Checkpointer
from theseus.training.logger import RunLogger
from theseus.training.preemption import Preemption
from theseus.training.profiler import Profiler
from theseus.training.state import TrainState


LAST = ("lr", "grad_norm", "nonfinite_skipped")  # the step's own metrics that a log line gives at its last step


class LogWindow:
    """The steps since the last logged one: each step's metrics (kept on device until the log
    fetches them all at once: no host sync per step), their wall time and data wait, less the
    pauses between steps (hooks: evaluation, checkpoints, the log itself)."""

    def __init__(self) -> None:
        self._restart(time.perf_counter())

    def _restart(self, now: float) -> None:
        self.began, self.paused, self.waited, self.steps, self._finished = now, 0.0, 0.0, [], 0

    def add(self, metrics: Mapping[str, jax.Array], waited: float) -> None:
        """Count one step: its metrics (device scalars) and the seconds it waited for its batch."""
        self.steps.append(dict(metrics))
        self.waited += waited

    def finished(self) -> int:
        """How many of the window's steps have finished on the device, asked without waiting
        (the loop dispatches steps ahead of the device): each step's metrics are ready once it
        has run, and the steps run in order."""
        while self._finished < len(self.steps) and next(iter(self.steps[self._finished].values())).is_ready():
            self._finished += 1
        return self._finished

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Time spent inside is not step time. A window closed inside (the log hook) keeps the
        time up to its close, the wait for its last step included; the next one counts none."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.paused += time.perf_counter() - max(start, self.began)

    def close(self) -> dict[str, float]:
        """The window's metrics, and the next window begins.

        Each metric is its mean over the window's steps (``loss`` and the task's metrics alike,
        so that a log line's numbers describe the same steps: a mixture of experts' ``loss`` is
        its ``lm_loss`` plus the weighted auxiliary losses), but ``LAST`` (lr, grad_norm, the
        count of skipped steps: the last step's); ``step_time`` and ``data_wait`` are seconds per
        step, measured once the last step has finished.
        """
        steps = jax.device_get(self.steps)  # one transfer
        now = time.perf_counter()
        metrics = {key: float(np.mean(np.asarray([step[key] for step in steps], np.float64))) for key in steps[-1]}
        metrics.update({key: float(steps[-1][key]) for key in LAST if key in steps[-1]})
        metrics.update(step_time=(now - self.began - self.paused) / len(steps), data_wait=self.waited / len(steps))
        self._restart(now)
        return metrics


@dataclass
class LoopState:
    """A run in progress: what the trainer's step and hooks read and update."""

    run_dir: Path
    compiled: Any  # theseus.training.compiled.Compiled
    state: TrainState
    loader: Any  # theseus.data.loader's: next() -> host batch, last_wait, get_state()
    logger: RunLogger
    checkpointer: Checkpointer | None
    dropout_key: jax.Array
    peak: float  # FLOP/s per device, for MFU
    step: int  # the last step taken (the restored one before the first)
    last_step: int  # trainer.max_steps
    preemption: Preemption | None = None
    metrics: dict[str, jax.Array] = field(default_factory=dict)  # the last step's, on device
    window: LogWindow = field(default_factory=LogWindow)
    val_loss: float = math.nan  # the latest evaluation's
    evaluated: bool = False  # whether this step evaluated
    logged: dict[str, float] = field(default_factory=dict)  # the latest log window's metrics
    evaluation: tuple[int, dict[str, float]] | None = None  # (step, metrics) of the latest evaluation
    began: float = field(default_factory=time.perf_counter)  # when this process's loop was made
    stop: int | None = None  # the signal every process agreed to stop on
    profiler: Profiler = field(default_factory=lambda: Profiler(None, Path()))  # trainer.profile_steps; off

    def due(self, every: int) -> bool:
        """Whether a cadence of ``every`` steps (0: only at the end) falls on this step; the
        last step is always due."""
        return (every > 0 and self.step % every == 0) or self.step == self.last_step


Hook = Callable[[LoopState], None]  # runs after every step; decides with loop.due whether it acts
