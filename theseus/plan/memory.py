"""Will it fit? The compiled step's memory per device against the device's, and when it does
not fit, what is estimated to make it fit.

The step's footprint is XLA's memory analysis (``metrics.memory_report``): arguments and
outputs (params, optimizer state, batch; outputs that reuse donated arguments counted once)
plus temporaries, mostly activations. ``grad_accum`` splits the batch into more micro-batches
that run one after another, so the temporaries are *estimated* to scale with the micro-batch
(``temp x grad_accum / candidate``). That holds for activations but not for every temporary
(on a TPU, XLA's temp can stay level as grad_accum doubles): a dry run compiles what it advises
instead (``theseus.plan.fitting``); a run that starts here says the estimate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import jax

from theseus.config import ConfigError
from theseus.training.metrics import format_bytes
from theseus.training.parts import Run

REMAT_ORDER = ("none", "dots", "full")  # least memory last


def device_memory(device: jax.Device) -> tuple[int, str]:
    """``(bytes, source)``: the device's memory limit, or the host's RAM for a CPU device."""
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{device.device_kind} memory_stats"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host RAM"


@dataclass(frozen=True)
class Fit:
    """The verdict: ``needed`` bytes per device against ``limit``, and what would make it fit."""

    needed: int
    limit: int
    source: str
    advice: str  # empty when it fits

    @property
    def fits(self) -> bool:
        return self.needed <= self.limit

    def rows(self) -> list[tuple[str, str]]:
        return [("device memory / device", f"{format_bytes(self.limit)} ({self.source})"),
                ("fits", f"{'yes' if self.fits else 'NO'}: the step needs {format_bytes(self.needed)}")]

    def problem(self) -> str:
        """A step that does not fit, in one line: how much, and what would make it fit."""
        return (f"the step needs {format_bytes(self.needed)} per device, more than the "
                f"{format_bytes(self.limit)} of the device ({self.source}): {self.advice}")

    def message(self) -> str:
        """The dry run's warning: ``problem`` as a warning."""
        return f"theseus: warning: {self.problem()}"


def check_fit(memory: Mapping[str, int], limit: int, source: str, *, batch_size: int, grad_accum: int,
              parallel: int, remat: str | None = None) -> Fit:
    """Whether a step with XLA memory ``memory`` (bytes per device) fits in ``limit``, and if not,
    what is estimated to make it fit (nothing compiled: a dry run compiles its advice,
    ``theseus.plan.fitting``).

    ``batch_size``: global sequences per step, split over ``parallel`` = data x fsdp devices and
    ``grad_accum`` micro-batches. ``remat``: the model's current policy (None: a model without
    the key).
    """
    needed = memory["total"]
    if needed <= limit:
        return Fit(needed, limit, source, "")
    fixed, temp = needed - memory["temp"], memory["temp"]
    if fixed >= limit:
        return Fit(needed, limit, source, f"parameters, optimizer state and batch alone take {format_bytes(fixed)}: "
                                          f"shard them (mesh.fsdp) or use more devices")
    also = " (architecture.remat=full may also help)" if remat is not None and remat != "full" else ""
    g, estimated = accumulation(batch_size, grad_accum, parallel, fixed, temp, limit)
    if estimated:
        return Fit(needed, limit, source, f"set trainer.grad_accum={g} (estimated {format_bytes(estimated)} if "
                                          f"activations scale with the micro-batch){also}")
    return Fit(needed, limit, source, "no trainer.grad_accum dividing the batch is estimated to fit: lower "
                                      f"trainer.batch_size or architecture.seq_len, or shard over more devices{also}")


def accumulation(batch_size: int, grad_accum: int, parallel: int, fixed: int, temp: int,
                 limit: int) -> tuple[int | None, float | None]:
    """The ``trainer.grad_accum`` to try instead of ``grad_accum`` and the bytes it is estimated
    to need (``fixed + temp x grad_accum / g``): the smallest that divides the batch (over
    ``parallel`` devices) and is estimated to fit ``limit``; else the most the batch allows,
    estimated None; ``(None, None)`` when no larger one divides it."""
    accums = [g for g in range(grad_accum + 1, batch_size // parallel + 1) if batch_size % (g * parallel) == 0]
    for g in accums:
        if fixed + temp * grad_accum / g <= limit:
            return g, fixed + temp * grad_accum / g
    return (accums[-1] if accums else None), None


def limit_of(run: Run) -> tuple[int, str]:
    """``(bytes, source)``: what ``run``'s step must fit in per device: ``trainer.memory_limit``,
    else a planned run's target's HBM, else this machine's device memory."""
    s = run.settings.trainer
    return ((s.memory_limit, "trainer.memory_limit") if s.memory_limit
            else (int(run.target.hbm), f"{run.target.chip.name} HBM") if run.target
            else device_memory(jax.local_devices()[0]))


def fit_of(run: Run) -> Fit:
    """Whether ``run``'s compiled step fits its device (``limit_of``)."""
    s = run.settings.trainer
    return check_fit(run.compiled.memory, *limit_of(run), batch_size=s.batch_size, grad_accum=s.grad_accum,
                     parallel=run.batch_parallel, remat=getattr(run.model, "remat", None))


def check_memory(run: Run) -> None:
    """ConfigError when the compiled train step does not fit the device, with what would."""
    if run.compiled.memory:
        fit = fit_of(run)
        if not fit.fits:
            raise ConfigError(fit.problem())
