"""``trainer.dry_run=true``: assemble and compile a run, report what it would take, write nothing.

It prints the parameters, FLOPs and XLA's memory per device, whether the step fits (and what
would make it fit), and with ``mesh.target`` the step's predicted time on that hardware
(``theseus.plan.predict``) with the tokens/s, MFU and chip-hours it implies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from omegaconf import DictConfig

from theseus.base.compile_oom import DoesNotFit
from theseus.plan.fitting import Found, smallest_fit
from theseus.plan.memory import fit_of, limit_of
from theseus.plan.predict import KERNEL_STEP_S, Hardware, Prediction, predict
from theseus.plan.traffic import hbm_bytes_by_part
from theseus.training.metrics import format_bytes, format_duration, format_si
from theseus.training.parts import Run
from theseus.training.console import RunConsole
from theseus.training.state import n_params
from theseus.training.summary import describe


def dry_run(cfg: DictConfig, assemble: Callable[..., Run], in_sweep: bool = False) -> dict[str, Any]:
    """Assemble ``cfg`` (``assemble``: ``theseus.recipe.assemble`` of its resolved spec), print its
    plan; returns the plan's summary (a sweep's row): target, fits, memory, limit, step_s, chip_hours, and
    ``fits_with``, the overrides of the smallest change that fits when it does not (compiled:
    ``theseus.plan.fitting``). A step that runs out of device memory as it compiles is a
    ConfigError (DoesNotFit) naming that change; ``in_sweep``, a warning and a row that does not
    fit (what it needs against what the device has), so that the sweep's other points are still
    planned."""
    try:
        run = assemble(cfg)
    except DoesNotFit as exc:
        layout = assemble(cfg, steps=None, announce=False)
        limit, _ = limit_of(layout)
        found = _smallest_fit(cfg, assemble, layout, limit, exc.oom.needed)
        exc = exc.advised(found.advice())
        if not in_sweep:
            raise exc from None
        if jax.process_index() == 0:
            RunConsole().show(f"theseus: warning: {exc}")
        return {"target": layout.settings.mesh.target, "fits": False, "memory": exc.oom.needed,
                "limit": exc.oom.available, "step_s": None, "chip_hours": None, "fits_with": _overrides(found)}
    compiled, devices, target = run.compiled, run.devices, run.target
    peak, _ = run.peak
    rows = describe(run, n_params(compiled.target.params))
    rows.append(("step time at 100% MFU", duration(run.flops_per_step / (peak * len(devices)))))
    rows.append(("compile time", duration(compiled.seconds)))
    fit = fit_of(run) if compiled.memory else None
    found = None
    if fit and not fit.fits:
        found = _smallest_fit(cfg, assemble, run, fit.limit, fit.needed)
        fit = dataclasses.replace(fit, advice=found.advice())
    rows += fit.rows() if fit else []
    prediction = _predict(run) if target else None
    if prediction:
        rows += _prediction_rows(run, prediction)
    rows += traffic_rows(run)
    console = RunConsole()
    if jax.process_index() == 0:
        console.show_table(f"theseus dry run for {target.name}" if target else "theseus dry run", rows)
        if fit and not fit.fits:
            console.show(fit.message())
    return {"target": target.name if target else None, "fits": fit.fits if fit else None,
            "memory": fit.needed if fit else None, "limit": fit.limit if fit else None,
            "step_s": prediction.step_s if prediction else None,
            "chip_hours": _chip_hours(run, prediction.step_s) if prediction else None,
            "fits_with": _overrides(found)}


def _smallest_fit(cfg: DictConfig, assemble: Callable[..., Run], layout: Run, limit: int, needed: int) -> Found:
    """The smallest change that fits, compiling at most ``trainer.fit_candidates`` (timed, said)."""
    budget = layout.settings.trainer.fit_candidates
    if budget and jax.process_index() == 0:
        RunConsole().show(f"theseus: the step does not fit: compiling up to {budget} changed settings for one that "
                          f"does (trainer.fit_candidates)")
    return smallest_fit(cfg, assemble, layout, limit, needed, budget, score=_mfu)


def _overrides(found: Found | None) -> list[str] | None:
    return None if found is None or found.fit is None else [f"{k}={v}" for k, v in found.fit[0].items()]


def _mfu(run: Run, step_s: float | None = None) -> float | None:
    """The MFU of a run planned for a target at its predicted step time (or ``step_s``); None
    without a target."""
    if not run.target:
        return None
    return run.flops_per_step / ((step_s or _predict(run).step_s) * run.peak[0] * len(run.devices))


def _predict(run: Run) -> Prediction:
    """The step's instructions' rooflines on the target's devices, summed (``theseus.plan.predict``)."""
    target = run.target
    hardware = Hardware.of(target.chip.name, peak=run.peak[0], bandwidth=target.hbm_bandwidth,
                           interconnect=target.interconnect, per_chip=target.per_chip)
    return predict(run.compiled.step, hardware, flops_per_device=run.flops_per_step / len(run.devices),
                   loop_trips=run.settings.trainer.grad_accum)


def _chip_hours(run: Run, step_s: float) -> float:
    return step_s * run.settings.trainer.max_steps * len(run.devices) / run.target.per_chip / 3600


def _prediction_rows(run: Run, p: Prediction) -> list[tuple[str, str]]:
    target, step = run.target, p.step_s
    steps = [("predicted: kernel steps / step", f"{duration(p.kernel_steps_s)} ({p.kernel_steps:,} grid steps of "
              f"Pallas kernels at {KERNEL_STEP_S * 1e6:.2g} us)")] if p.kernel_steps else []
    return [
        ("predicted: compute / step", f"{duration(p.compute_s)} in instructions bound by their matrix products "
                                      f"({format_si(p.flops, 'FLOP')} in all at {format_si(p.rate, 'FLOP/s')})"),
        ("predicted: memory / step", f"{duration(p.memory_s)} in instructions bound by HBM ({format_bytes(p.accessed)} "
                                     f"in all at {format_si(target.hbm_bandwidth, 'B/s')})"),
        *steps,
        ("predicted: collectives / step", f"{duration(p.collective_s)} ({format_bytes(p.sent)} sent per device "
                                          f"at {format_si(target.interconnect, 'B/s')})"),
        ("predicted: step time", f"{duration(step)} ({p.bound}-bound; roofline of each instruction, summed; "
                                 f"collectives not overlapped)"
         + (f"; XLA's estimate {duration(p.xla_optimal_s)}" if p.xla_optimal_s else "")),
        ("predicted: tokens / s", format_si(run.tokens_per_step / step)),
        ("predicted: MFU", f"{_mfu(run, step):.1%}"),
        ("predicted: chip-hours",
         f"{_chip_hours(run, step):.3g} for trainer.max_steps={run.settings.trainer.max_steps}"),
    ]


def traffic_rows(run: Run, top: int = 5) -> list[tuple[str, str]]:
    """The bytes the step's instructions move through device memory (``traffic``: HBM on an
    accelerator) and the ``top`` largest parts with their shares; the optimizer update's says
    what ``mesh.fsdp`` would save, where the state is whole on every device of the batch."""
    parts = hbm_bytes_by_part(run.compiled.step.as_text())
    total = sum(parts.values())
    if not total:
        return []
    rows = [("memory traffic / step", f"{format_bytes(total)} read and written by its instructions")]
    for part, moved in parts.most_common(top):
        row = f"{format_bytes(moved)} ({moved / total:.0%})"
        if part == "optimizer update" and run.mesh_shape["fsdp"] == 1 and run.batch_parallel > 1:
            row += f"; mesh.fsdp={run.batch_parallel} splits it {run.batch_parallel} ways"
        rows.append((f"traffic: {part}", row))
    return rows


def duration(seconds: float) -> str:
    """A short span in the unit that reads best: ``2.31 ms``, ``4.5 s``, ``13m05s``."""
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s" if seconds < 60 else format_duration(seconds)
