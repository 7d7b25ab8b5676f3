"""GPU: MFU of gpt2_124m at sequence 1024 in bf16 for a few batch sizes, with cuDNN flash
attention on and off (``architecture.attention_impl=cudnn`` vs ``xla``). Target: MFU >= 55%
on an H200. One short script for a 10-minute device budget:

    python benchmarks/gpu.py

Configurations are built in order of interest until ``--budget`` seconds are spent (a
configuration that fails to build, e.g. cuDNN attention unsupported, is recorded and
skipped), then timed interleaved, a window of steps at a time. Results are written after
building and again after timing, so a run cut short still leaves its figures. MFU is
``model.flops`` per second (attention counted in full, not causal-halved) over the table
peak of the device. Try it small on a CPU: ``--experiment gpt_tiny --batches 4 --impls xla``.

``--variants`` adds, at the first batch size and attention implementation, the scale knobs:
each ``architecture.remat`` policy with ``architecture.scan_layers``, and unrolled ``full``;
each records its build (compile) seconds and XLA memory beside its MFU.
"""

from __future__ import annotations

import argparse
import time

import jax
from common import device_batch, experiment, interleaved, make_run, save, show, spread

from theseus.training.metrics import format_bytes

STEPS = 10  # steps per timed window
VARIANTS = {  # name -> overrides: the scale knobs, measured at the first batch and implementation
    "scan": ["architecture.scan_layers=true"],
    "scan remat=dots": ["architecture.scan_layers=true", "architecture.remat=dots"],
    "scan remat=full": ["architecture.scan_layers=true", "architecture.remat=full"],
    "remat=full": ["architecture.remat=full"],
}


class Config:
    """One (attention implementation, batch size): built, initialised, warmed up."""

    def __init__(self, overrides: list[str]):
        self.run = make_run(overrides)
        self.compiled = self.run.compiled
        self.state = self.compiled.init()
        s = self.run.settings.trainer
        loader = self.run.dataset.loader("train", self.run.model.seq_len, s.batch_size, seed=0)
        self.tokens = device_batch(self.run, next(loader))
        loader.close()
        self.key = jax.random.key(0)
        self.window(2)  # first executions: autotuning, allocation

    def window(self, steps: int = STEPS) -> float:
        """Seconds per step over ``steps`` steps (the same batch each step)."""
        began = time.perf_counter()
        for _ in range(steps):
            self.state, metrics = self.compiled.step(self.state, self.tokens, self.key)
        jax.block_until_ready(metrics)
        return (time.perf_counter() - began) / steps

    def figures(self, step_s: float) -> dict:
        run = self.run
        peak, source = run.peak
        return {"step_s": step_s, "tokens_per_s": run.tokens_per_step / step_s,
                "mfu": run.flops_per_step / step_s / (peak * jax.device_count()), "peak_flops": peak,
                "peak_source": source, "xla_memory": self.compiled.memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="gpt2_124m")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32, 8], help="in order of interest")
    parser.add_argument("--impls", nargs="+", default=["cudnn", "xla"], choices=["cudnn", "xla"])
    parser.add_argument("--budget", type=float, default=360, help="seconds for building configurations")
    parser.add_argument("--rounds", type=int, default=5, help="timed windows per configuration")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                        help="scale knobs to add at the first batch and implementation")
    args = parser.parse_args()
    began = time.perf_counter()
    base = [*experiment(args.experiment), "data.tokenizer=byte", "architecture.dtype.activation=bfloat16",
            "trainer.grad_accum=1"]  # bytes as tokens: no BPE to fit; the shapes are the job's
    built, results = {}, {}
    first = f"{args.impls[0]} batch {args.batches[0]}"
    plan = [(f"{impl} batch {batch}", [f"architecture.attention_impl={impl}", f"trainer.batch_size={batch}"])
            for batch in args.batches for impl in args.impls]
    plan[1:1] = [(f"{first} {variant}", [*plan[0][1], *VARIANTS[variant]]) for variant in args.variants]
    for name, overrides in plan:
        if time.perf_counter() - began > args.budget:
            results[name] = {"skipped": "out of time budget"}
            continue
        try:
            build_began = time.perf_counter()
            built[name] = Config([*base, *overrides])
            results[name] = {"built_after_s": time.perf_counter() - began,
                             "build_s": time.perf_counter() - build_began}
        except Exception as exc:  # noqa: BLE001  (recorded: an unsupported kernel must not end the run)
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        save("gpu", {"experiment": args.experiment, "overrides": base, "configs": results})
    samples = interleaved({name: config.window for name, config in built.items()}, args.rounds)
    for name, config in built.items():
        results[name].update(config.figures(spread(samples[name])["median"]), samples=samples[name])
    rows = [(name, r["step_s"] * 1e3, f"{r['tokens_per_s']:,.0f}", f"{100 * r['mfu']:.1f}%", r["build_s"],
             format_bytes(r["xla_memory"].get("temp", 0))) if "mfu" in r
            else (name, "-", "-", r.get("error", r.get("skipped", ""))[:80], "-", "-") for name, r in results.items()]
    show(f"GPU: {args.experiment}, bf16, {jax.devices()[0].device_kind} (median of {args.rounds} windows)",
         ["attention, batch, knobs", "step ms", "tokens/s", "MFU", "build s", "XLA temp"], rows,
         note="target: MFU >= 55% on an H200")
    save("gpu", {"experiment": args.experiment, "overrides": base, "configs": results,
                 "total_s": time.perf_counter() - began})


if __name__ == "__main__":
    main()
