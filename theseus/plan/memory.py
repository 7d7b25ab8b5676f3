"""Will it fit? The compiled step's memory per device against the device's, and when it does
not fit, the smallest ``trainer.grad_accum`` or ``architecture.remat`` that would.

The step's footprint is XLA's memory analysis (``metrics.memory_report``): arguments and
outputs (params, optimizer state, batch; outputs that reuse donated arguments counted once)
plus temporaries, mostly activations. ``grad_accum`` splits the batch into more micro-batches
that run one after another, so the temporaries are *estimated* to scale with the micro-batch
(``temp x grad_accum / candidate``). That holds for activations but not for every temporary
(on a TPU, XLA's temp can stay level as grad_accum doubles): when a callable that compiles the
step under another setting is given, the advice is *compiled* (its memory measured) before it
is named: the smallest grad_accum estimated to fit and, if that does not, the most the batch
allows; each remat policy in turn.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
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
              parallel: int, remat: str | None = None,
              compile_memory: Callable[[str, int | str], Mapping[str, int]] | None = None) -> Fit:
    """Whether a step with XLA memory ``memory`` (bytes per device) fits in ``limit``.

    ``batch_size``: global sequences per step, split over ``parallel`` = data x fsdp devices and
    ``grad_accum`` micro-batches. ``remat``: the model's current policy (None: a model without
    the key). ``compile_memory(key, value)`` compiles the step with config key ``key`` (
    ``trainer.grad_accum``, ``architecture.remat``) set to ``value`` and returns its memory;
    without it the grad_accum advice is an estimate, said so, and no remat policy is tried.
    """
    needed = memory["total"]
    if needed <= limit:
        return Fit(needed, limit, source, "")
    fixed, temp = needed - memory["temp"], memory["temp"]
    options, notes = [], []
    if fixed < limit:
        accums = [g for g in range(grad_accum + 1, batch_size // parallel + 1) if batch_size % (g * parallel) == 0]
        fitting = [g for g in accums if fixed + temp * grad_accum / g <= limit]
        if fitting and compile_memory is None:
            g = fitting[0]
            options.append(f"trainer.grad_accum={g} (estimated {format_bytes(fixed + temp * grad_accum / g)} if "
                           f"activations scale with the micro-batch; not compiled)")
        for g in dict.fromkeys([fitting[0], accums[-1]]) if fitting and compile_memory else ():
            total = compile_memory("trainer.grad_accum", g)["total"]
            if total <= limit:
                options.append(f"trainer.grad_accum={g} (compiled: {format_bytes(total)})")
                break
            notes.append(f"trainer.grad_accum={g} compiled to {format_bytes(total)}")
    if remat is not None and compile_memory is not None:
        for policy in REMAT_ORDER[REMAT_ORDER.index(remat) + 1:]:
            total = compile_memory("architecture.remat", policy)["total"]
            if total <= limit:
                options.append(f"architecture.remat={policy} (compiled: {format_bytes(total)})")
                break
    untried = ("; architecture.remat=full may also help (not compiled: the step compiles slowly)"
               if remat is not None and remat != "full" and compile_memory is None else "")
    tried = f" ({', '.join(notes)}: over)" if notes else ""
    if options:
        return Fit(needed, limit, source, "set " + ", or ".join(options) + tried + untried)
    if fixed >= limit:
        advice = (f"parameters, optimizer state and batch alone take {format_bytes(fixed)}: shard them "
                  f"(mesh.fsdp) or use more devices")
    else:
        advice = ("no trainer.grad_accum dividing the batch fits, nor a remat policy: lower trainer.batch_size "
                  "or architecture.seq_len, or shard over more devices")
    return Fit(needed, limit, source, advice + tried + untried)


def fit_of(run: Run, compile_memory: Callable[[str, int | str], dict[str, int]] | None = None) -> Fit:
    """Whether ``run``'s compiled step fits its device (``trainer.memory_limit`` overrides its
    size; a target's HBM for a planned run); ``compile_memory(key, value)``, when given,
    compiles the step under an advised setting first."""
    s = run.settings.trainer
    limit, source = ((s.memory_limit, "trainer.memory_limit") if s.memory_limit
                     else (int(run.target.hbm), f"{run.target.chip.name} HBM") if run.target
                     else device_memory(jax.local_devices()[0]))
    return check_fit(run.compiled.memory, limit, source, batch_size=s.batch_size, grad_accum=s.grad_accum,
                     parallel=run.batch_parallel, remat=getattr(run.model, "remat", None),
                     compile_memory=compile_memory)


def check_memory(run: Run) -> None:
    """ConfigError when the compiled train step does not fit the device, with what would."""
    if run.compiled.memory:
        fit = fit_of(run)
        if not fit.fits:
            raise ConfigError(fit.problem())
