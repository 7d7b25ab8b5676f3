"""Start-up: seconds from ``python -m theseus.run +experiment=gpt_small`` to its first completed
step, where that time goes, and the latency of quick commands (``--help``, a typo's error, a dry
run's first line) as a ratio to a fresh Python importing the libraries they need.

The run is the real command line (W&B off, a log line every step) in a fresh process; it is
stopped once its first step is logged. The phases are timed in another fresh process that
walks the same path by hand: import, compose, ``assemble`` (settings, data, model and plan;
then the trace + compile of the train and eval steps, reported apart), init (compiled on first
use), first batch, first step.

    python benchmarks/startup.py [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, child, experiment, interleaved, save, show, stand_in

FIRST_STEP = re.compile(r"^step 1/")


def first_step(overrides: list[str]) -> dict[str, float]:
    """Seconds from launch until the run prints its table and its first step line."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [sys.executable, "-m", "theseus.run", *overrides, "trainer.max_steps=2", "trainer.log_every=1",
                   "logger.mode=disabled", f"hydra.run.dir={run_dir}"]
        began = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen: dict[str, float] = {}
        for line in process.stdout:
            if "theseus run" in line and "table_s" not in seen:
                seen["table_s"] = time.perf_counter() - began  # built, compiled, initialised: the table
            if FIRST_STEP.match(line):
                seen["first_step_s"] = time.perf_counter() - began
                break
        process.kill()
        process.wait()
    if "first_step_s" not in seen:
        raise RuntimeError(f"no first step from: {' '.join(command)}")
    return seen


# What a quick command needs at the least: a fresh Python importing the libraries it uses.
IMPORTS = ["-c", "import jax, jax.numpy, flax.linen, optax, hydra, omegaconf"]
QUICK = {  # command lines that should come back in about the time of IMPORTS
    "--help": ["-m", "theseus.run", "--help"],
    "a typo's error (optimizer.lrr=1)": ["-m", "theseus.run", "+experiment=gpt_small", "optimizer.lrr=1"],
    "a dry run's first line": ["-m", "theseus.run", "+experiment=gpt_small", "trainer.dry_run=true", "logger.mode=disabled"],
}


def latency(args: list[str], to_exit: bool = False) -> float:
    """Seconds from launching ``python ARGS`` to its first line of output, or (``to_exit``) to
    its exit: the bare imports print nothing of their own (the lines the plan extra's CUDA plugin
    prints as jaxlib loads come within a fraction of a second)."""
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        process = subprocess.Popen([sys.executable, *args], cwd=folder, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)  # any output lands in folder
        process.communicate() if to_exit else process.stdout.readline()
        seconds = time.perf_counter() - began
        process.kill()
        process.wait()
    return seconds


def quick_commands(repeats: int) -> dict[str, list[float]]:
    """Each quick command and the bare imports, alternated ``repeats`` times (fresh processes)."""
    sides = {name: lambda a=args: latency(a) for name, args in QUICK.items()}
    return interleaved({"imports (jax, flax, optax, hydra)": lambda: latency(IMPORTS, to_exit=True), **sides}, repeats)


def _time_phases(overrides: list[str]) -> None:
    """The run's start-up path by hand, each phase timed; prints one JSON line."""
    clock = time.perf_counter()
    times: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        times[name], clock = now - clock, now

    import jax

    import theseus.cli.run  # noqa: F401  (what the command line imports)
    from theseus.config.compose import compose
    from theseus.recipe import assemble, resolve
    from theseus.training.batches import global_batch
    lap("import")
    cfg = compose([*overrides, "logger.mode=disabled"])
    lap("compose")
    run = assemble(resolve(cfg))
    lap("assemble")
    compiled = run.compiled  # assemble's lap split: its compile, and the rest (settings, data, model, layout)
    times["resolve + assemble: settings, data, model, layout"] = times.pop("assemble") - compiled.seconds
    times["resolve + assemble: trace + compile step, eval"] = compiled.seconds
    state = compiled.init()
    jax.block_until_ready(state)
    lap("init: compile + run")
    s = run.settings.trainer
    loader = run.dataset.loader("train", run.model.seq_len, s.batch_size, seed=run.settings.data.seed)
    tokens = global_batch(next(loader), compiled.mesh, s.batch_size, s.grad_accum)
    lap("loader + first batch")
    run.peak  # noqa: B018  (a cached property: measured here, once)
    lap("peak FLOP/s")
    jax.block_until_ready(compiled.step(state, tokens, jax.random.key(0)))
    lap("first step")
    print(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each command line (median)")
    parser.add_argument("--phases", nargs="*", help=argparse.SUPPRESS)  # the phase timer's own process
    args = parser.parse_args()
    if args.phases is not None:
        return _time_phases(args.phases)
    overrides = experiment("gpt_small")
    runs = [first_step(overrides) for _ in range(args.repeats)]
    quick = quick_commands(max(3, args.repeats))
    medians = {name: statistics.median(values) for name, values in quick.items()}
    base = medians.pop("imports (jax, flax, optax, hydra)")
    results = {
        "experiment": "gpt_small", "stand_in": stand_in("gpt_small"), "overrides": overrides,
        "first_step_s": statistics.median(r["first_step_s"] for r in runs),
        "table_s": statistics.median(r["table_s"] for r in runs), "runs": runs,
        "imports_s": base, "quick_s": medians, "quick_to_imports": {k: v / base for k, v in medians.items()},
        "quick_samples": quick, "phases": child(__file__, "--phases", *overrides),
    }
    show("start-up (median of fresh processes)", ["measure", "seconds", "x imports", "target"],
         [("python -m theseus.run +experiment=gpt_small: first step", results["first_step_s"], "", "< 20"),
          ("  ... of which until the summary table (built, compiled, initialised)", results["table_s"], "", ""),
          ("importing jax, flax, optax and hydra", base, 1.0, ""),
          *((f"python -m theseus.run {name}", s, s / base, "close to 1") for name, s in medians.items())])
    show("start-up phases (one fresh process, the run's path by hand)", ["phase", "seconds"],
         [*results["phases"].items(), ("total", sum(results["phases"].values()))])
    save("startup", results)


if __name__ == "__main__":
    main()
