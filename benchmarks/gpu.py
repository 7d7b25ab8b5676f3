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
"""

from __future__ import annotations

import argparse
import time

import jax
from common import experiment, interleaved, make_trainer, save, show, spread

STEPS = 10  # steps per timed window


class Config:
    """One (attention implementation, batch size): built, initialised, warmed up."""

    def __init__(self, overrides: list[str]):
        self.trainer = make_trainer(overrides)
        self.compiled = self.trainer.build()
        self.state = self.compiled.init()
        s = self.trainer.settings
        loader = self.trainer.dataset.loader("train", self.trainer.seq_len, s.batch_size, seed=0)
        self.tokens = self.trainer._global_batch(next(loader), self.compiled.mesh)
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
        t = self.trainer
        peak, source = t.peak()
        return {"step_s": step_s, "tokens_per_s": t.tokens_per_step / step_s,
                "mfu": t.flops_per_step / step_s / (peak * jax.device_count()), "peak_flops": peak,
                "peak_source": source, "xla_memory": self.compiled.memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="gpt2_124m")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32, 8], help="in order of interest")
    parser.add_argument("--impls", nargs="+", default=["cudnn", "xla"], choices=["cudnn", "xla"])
    parser.add_argument("--budget", type=float, default=360, help="seconds for building configurations")
    parser.add_argument("--rounds", type=int, default=5, help="timed windows per configuration")
    args = parser.parse_args()
    began = time.perf_counter()
    base = [*experiment(args.experiment), "data.tokenizer=byte", "architecture.dtype.activation=bfloat16",
            "trainer.grad_accum=1"]  # bytes as tokens: no BPE to fit; the shapes are the job's
    built, results = {}, {}
    for batch in args.batches:
        for impl in args.impls:
            name = f"{impl} batch {batch}"
            if time.perf_counter() - began > args.budget:
                results[name] = {"skipped": "out of time budget"}
                continue
            try:
                built[name] = Config([*base, f"architecture.attention_impl={impl}", f"trainer.batch_size={batch}"])
                results[name] = {"built_after_s": time.perf_counter() - began}
            except Exception as exc:  # noqa: BLE001  (recorded: an unsupported kernel must not end the run)
                results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            save("gpu", {"experiment": args.experiment, "overrides": base, "configs": results})
    samples = interleaved({name: config.window for name, config in built.items()}, args.rounds)
    for name, config in built.items():
        results[name].update(config.figures(spread(samples[name])["median"]), samples=samples[name])
    rows = [(name, r["step_s"] * 1e3, f"{r['tokens_per_s']:,.0f}", f"{100 * r['mfu']:.1f}%") if "mfu" in r
            else (name, "-", "-", r.get("error", r.get("skipped", ""))[:80]) for name, r in results.items()]
    show(f"GPU: {args.experiment}, bf16, {jax.devices()[0].device_kind} (median of {args.rounds} windows)",
         ["attention, batch", "step ms", "tokens/s", "MFU"], rows, note="target: MFU >= 55% on an H200")
    save("gpu", {"experiment": args.experiment, "overrides": base, "configs": results,
                 "total_s": time.perf_counter() - began})


if __name__ == "__main__":
    main()
