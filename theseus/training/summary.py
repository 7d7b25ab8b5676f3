"""What a run says about itself: the table at its start (model, mesh, memory, FLOPs), the
summary it records, and the report at its end with the commands that go on from it."""

from __future__ import annotations

import signal
import time
from typing import Any

import jax

from theseus.training.commands import command_line, resume_command
from theseus.training.logger import sync_command
from theseus.training.loop import LoopState
from theseus.training.metrics import format_bytes, format_duration, format_si
from theseus.training.parts import Run
from theseus.training.console import RunConsole
from theseus.training.state import bytes_per_device

FLOPS_CONVENTION = ("model.flops(seq): forward+backward, 6 x matmul params x seq (4 for a frozen weight: no gradient) "
                    "+ 12 x heads x head_dim per layer and (query, key) pair its attention kernel computes (written "
                    "out: seq^2; splash: the blocks its mask reaches) per sequence; MFU = FLOP/s / (peak x devices)")


def describe(run: Run, params: int) -> list[tuple[str, str]]:
    """The rows of a run's (or a dry run's) table: model, mesh, memory per device, FLOPs, peak."""
    compiled, devices, target = run.compiled, run.devices, run.target
    peak, source = run.peak
    rows = [
        ("model", f"{type(run.model).__name__}: {params:,} parameters"
         + (f", {run.trained_params:,} trained ({run.trained_params / params:.2%})" if run.trained_params < params
            else "")),
        ("mesh", " x ".join(f"{k}={v}" for k, v in run.mesh_shape.items())
         + f" = {len(devices)} x {devices[0].device_kind}"
         + (f" on {target.process_count} hosts" if target and target.process_count > 1 else "")),
        ("params / device", format_bytes(bytes_per_device(compiled.target.params))),
        ("optimizer state / device", format_bytes(bytes_per_device(compiled.target.opt_state))),
        ("tokens / step", f"{run.tokens_per_step:,}"),
        ("FLOPs / step", f"{run.flops_per_step:.3e} analytic"
         + (f", {compiled.xla_flops:.3e} XLA ({compiled.xla_flops / run.flops_per_step:.2f}x)"
            if compiled.xla_flops else "") + (f"; {run.flops_note}" if run.flops_note else "")),
        ("peak FLOP/s / device", f"{peak:.3e} ({source})"),
    ]
    return rows + [(f"XLA {name} / device", format_bytes(v)) for name, v in compiled.memory.items()]


def record(run: Run, params: int, say) -> dict[str, Any]:
    """What the run records about itself (the logger's summary), the FLOPs convention included;
    ``say``s a warning when XLA's FLOPs and the model's own differ by more than 25%."""
    analytic, measured = run.flops_per_step, run.compiled.xla_flops
    ratio = measured / analytic if measured else None
    if ratio is not None and abs(ratio - 1) > 0.25:
        say(f"warning: analytic FLOPs/step {analytic:.3e} differ from XLA's {measured:.3e} by more than 25%")
    peak, source = run.peak
    return {"n_params": params, "n_trained_params": run.trained_params, "flops_per_step": analytic,
            "xla_flops_per_step": measured,
            "flops_ratio_xla": ratio, "peak_flops": peak, "peak_flops_source": source,
            "device_kind": jax.local_devices()[0].device_kind, "n_devices": jax.device_count(),
            "mesh": run.mesh_shape, "flops_convention": FLOPS_CONVENTION, "flops_note": run.flops_note}


def report_end(run: Run, loop: LoopState, console: RunConsole) -> None:
    """This process's summary table of the run, then the commands that go on from the run."""
    run_dir, step = loop.run_dir, loop.step
    kept = loop.checkpointer.steps()
    if loop.stop:
        status = (f"interrupted by {signal.Signals(loop.stop).name} after step {step}/{loop.last_step}; "
                  f"checkpoint {step} saved")
    else:
        status = f"complete: step {step}/{loop.last_step}"
    rows = [("status", status), ("run directory", str(run_dir))]
    if "loss" in loop.logged:
        rows.append(("train loss", f"{loop.logged['loss']:.4f} (last logged window)"))
    if loop.evaluation is not None:
        at, metrics = loop.evaluation
        rows.append(("val_loss", f"{metrics['val_loss']:.4f} at step {at}"))
    if "tokens_per_s" in loop.logged:
        rows.append(("throughput", f"{format_si(loop.logged['tokens_per_s'])} tokens/s, "
                                   f"MFU {100 * loop.logged['mfu']:.1f}% (last logged window)"))
    rows.append(("wall time", format_duration(time.perf_counter() - loop.began)))
    rows.append(("checkpoints", ", ".join(map(str, kept)) or "none"))
    console.show_table("theseus run summary", rows)
    lines = [f"  resume:   {resume_command(run_dir)}"] if loop.stop else []
    if kept:
        extendable = run.settings.optimizer.schedule in ("constant", "wsd")  # wsd: before its decay
        more = (command_line(("trainer.max_steps=", "hydra.run.dir="), [f"hydra.run.dir={run_dir}"])
                if extendable else
                command_line(("trainer.max_steps=", "hydra.run.dir=", "trainer.init_from="),
                             [f"trainer.init_from={run_dir}", f"hydra.run.dir={run_dir}-more"]))
        # a chat model replies: trained on conversations (grpo's prompts may be text) by a template (dpo's pairs may be text)
        chats = run.task.chats(run.dataset) and run.task.chat_template(run.settings.data) is not None
        prompt = "--chat" if chats else "--prompt"
        lines += [f"  sample:   python -m theseus.sample {run_dir} {prompt} \"...\"",
                  f"  evaluate: python -m theseus.evaluate {run_dir}"]
        if run.exports:  # a model a Hugging Face config.json expresses
            lines.append(f"  export:   python -m theseus.export {run_dir} {run_dir}-hf")
        if extendable or run.base is None:  # adapters saved without their base start no run (export them merged)
            lines.append(f"  continue: {more} trainer.max_steps=N")
    sync = sync_command(run_dir)
    if sync:
        lines.append(f"  W&B:      {sync}")
    if lines:
        console.show("next:\n" + "\n".join(lines))
