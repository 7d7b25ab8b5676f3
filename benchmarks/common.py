"""What every benchmark shares: the model sizes, assembling a run (``theseus.recipe.assemble``),
interleaved timing, the table on the console and the JSON record in ``benchmarks/results/``.

Machines here are shared and noisy: a comparison is always measured in one process, its
sides interleaved (A B B A ...), and reported as a ratio of medians.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import theseus  # noqa: F401 (first: on a CPU host, no TPU or CUDA backend tried, and warning, in this process)

ROOT = Path(__file__).resolve().parents[1]
# where save() writes; BENCHMARK_RESULTS moves it (the tests run the scripts into a temporary folder)
RESULTS = Path(os.environ.get("BENCHMARK_RESULTS") or Path(__file__).resolve().parent / "results")

# Stand-ins for experiments with no file (yet); an existing experiments/NAME.yaml wins.
# gpt_small: the README's ~10M-parameter job; gpt_medium: a size between; gpt2_124m: GPT's
# defaults (GPT-2 small) with GPT-2's vocabulary padded to 50304, as nanoGPT does.
STAND_INS = {
    "gpt_small": ["+experiment=gpt_tiny", "architecture.n_layers=6", "architecture.d_model=384",
                  "architecture.n_heads=6", "architecture.seq_len=256", "trainer.batch_size=32"],
    "gpt_medium": ["+experiment=gpt_tiny", "architecture.n_layers=8", "architecture.d_model=512",
                   "architecture.n_heads=8", "architecture.seq_len=512", "architecture.vocab_size=8192"],
    "gpt2_124m": ["+experiment=gpt_tiny", "architecture.n_layers=12", "architecture.d_model=768",
                  "architecture.n_heads=12", "architecture.seq_len=1024", "architecture.vocab_size=50304"],
}
SIZES = ("gpt_tiny", "gpt_small", "gpt_medium", "gpt2_124m")  # the FLOPs table, smallest first
QUIET = ["logger.mode=disabled"]
CONSOLE = Console(width=160)  # wide enough for every table, also when piped


def experiment(name: str) -> list[str]:
    """Overrides selecting experiment ``name``: its file when there is one, else its stand-in."""
    return list(STAND_INS[name]) if stand_in(name) else [f"+experiment={name}"]


def stand_in(name: str) -> bool:
    """True when experiments/NAME.yaml does not exist and ``experiment(name)`` is a stand-in."""
    return not (ROOT / "experiments" / f"{name}.yaml").exists()


def make_run(overrides: Sequence[str], steps: str | None = "train"):
    """The run ``overrides`` describe, resolved and assembled (``theseus.recipe``; W&B off):
    ``steps="train"`` compiles the train and eval steps, ``"eval"`` the eval step, None neither."""
    from theseus.config.compose import compose
    from theseus.recipe import assemble, resolve

    return assemble(resolve(compose([*overrides, *QUIET])), steps=steps)


def build(run, steps: str | None = "train"):
    """``run``'s state layout and steps compiled again, afresh (``compile_steps``, as ``assemble``
    does): a build to time apart from assembling the run (its data, model and plan)."""
    from theseus.training.compiled import compile_steps

    return compile_steps(run.model, run.task, run.plan, run.compiled.mesh, run.settings, steps)


def device_batch(run, host, mesh=None):
    """A host batch from ``run``'s loader as the global ``[grad_accum, micro, ...]`` array its
    train step takes, on ``mesh`` (default: the run's)."""
    from theseus.training.batches import global_batch

    s = run.settings.trainer
    return global_batch(host, run.compiled.mesh if mesh is None else mesh, s.batch_size, s.grad_accum)


def interleaved(sides: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Call each side ``rounds`` times, alternating the order (A B, B A, ...); each call returns
    the seconds it measured. Returns every side's samples."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            samples[name].append(sides[name]())
    return samples


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def stopwatch(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``(seconds, result)`` of ``fn()``."""
    began = time.perf_counter()
    result = fn()
    return time.perf_counter() - began, result


def child(script: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """Run ``python SCRIPT ARGS`` in a fresh process (in ``env``: default this one's); the JSON its
    last line of output holds."""
    output = subprocess.run([sys.executable, script, *args], cwd=ROOT, check=True, stdout=subprocess.PIPE,
                            text=True, env=env).stdout
    return json.loads(output.splitlines()[-1])


def program_cost(compiled) -> dict[str, float]:
    """XLA's static cost of a compiled program (one device's share; a loop body counted once):
    ``flops``, ``bytes_accessed`` and ``temp_bytes`` (its scratch memory)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    memory = compiled.memory_analysis()
    return {"flops": float(cost.get("flops", 0.0)), "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
            "temp_bytes": float(memory.temp_size_in_bytes if memory else 0)}


def show(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], note: str | None = None) -> None:
    """A table on the console; floats get four significant digits."""
    table = Table(title=title, caption=note)
    for column in columns:
        table.add_column(column, justify="right" if column != columns[0] else "left")
    for row in rows:
        table.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row))
    CONSOLE.print(table)


def save(name: str, results: Any) -> Path:
    """Write ``results`` with the machine and command to ``benchmarks/results/NAME.json``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    record = {"benchmark": name, "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": machine(), "results": results}
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    CONSOLE.print(f"wrote {path}")
    return path


def machine() -> dict[str, Any]:
    """The host and JAX backend the figures were measured on: the processor (model, vendor and
    family, its vector extensions, clock and cores, the float32 vector peak), Python, JAX, the
    devices, ``XLA_FLAGS`` and the load average when the record was written."""
    import jax
    import jax.numpy as jnp

    from theseus.base.processor import processor, running

    cpu = running(processor()) if processor() else None  # at the clock the runs' MFU takes
    described = {} if cpu is None else {
        "cpu_vendor": cpu.vendor, "cpu_family": cpu.family, "cpu_model_number": cpu.model_number,
        "vector_extensions": cpu.extensions, "fma_bits": cpu.fma_bits, "ghz": cpu.ghz, "clock": cpu.clock,
        "physical_cores": cpu.cores,
        "peak_flops_float32": cpu.peak(jnp.float32), "peak_flops_bfloat16": cpu.peak(jnp.bfloat16)}
    return {"cpu": cpu.model if cpu else platform.processor() or platform.machine(), **described,
            "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(), "jax": jax.__version__,
            "backend": jax.default_backend(), "devices": jax.device_count(), "device_kind": jax.devices()[0].device_kind,
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "load_average": os.getloadavg()}
