"""Mixture of experts: ``moe_small``'s training step against ``gpt_small``'s, whose analytic
FLOPs per token it matches (8 experts of width 768, top 2, vs one MLP of 1536).

Both run through the trainer's own loop (``overhead.TheseusLoop``), interleaved a log window at
a time in one process; also ``moe_small`` with dropless routing (``capacity_factor=null``: every
expert holds a slot for every token of a sequence, so the experts compute ``n_experts /
top_k`` times what the tokens use). Reported: the step time of each against gpt_small's (the
median of paired ratios), and XLA's FLOPs of each compiled step against gpt_small's, the
ratio the step times would have if every FLOP cost the same.

    python benchmarks/moe.py [--batch-size 4] [--rounds 6]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import jax
import numpy as np
from common import interleaved, make_run, program_cost, save, show, spread
from overhead import TheseusLoop

SIDES = {
    "gpt_small": ["+experiment=gpt_small"],
    "moe_small": ["+experiment=moe_small"],
    "moe_small dropless": ["+experiment=moe_small", "architecture.moe.capacity_factor=null"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per step (the experiments': 16)")
    parser.add_argument("--rounds", type=int, default=6, help="log windows of 2 steps per side")
    args = parser.parse_args()
    common = [f"trainer.batch_size={args.batch_size}", "trainer.log_every=2", "trainer.grad_accum=1",
              f"trainer.max_steps={2 * (args.rounds + 2)}"]
    with tempfile.TemporaryDirectory() as runs:
        loops = {name: TheseusLoop(make_run([*overrides, *common]), Path(runs) / str(i))
                 for i, (name, overrides) in enumerate(SIDES.items())}
        for loop in loops.values():
            loop.window()  # warm-up
        samples = interleaved({name: (lambda loop=loop: loop.window()[0]) for name, loop in loops.items()},
                              args.rounds)
    base = "gpt_small"
    results = {}
    for name, loop in loops.items():
        cost = program_cost(loop.compiled.step)
        results[name] = {
            "overrides": [*SIDES[name], *common], "step_s": spread(samples[name]),
            "paired_ratio": float(np.median(np.divide(samples[name], samples[base]))),
            "xla_flops": cost["flops"], "model_flops": loop.run.flops_per_step,
            "n_params": sum(int(np.prod(p.shape)) for p in jax.tree.leaves(loop.state.params)),
            "samples": samples[name]}
    for r in results.values():
        r["xla_flops_ratio"] = r["xla_flops"] / results[base]["xla_flops"]
        r["model_flops_ratio"] = r["model_flops"] / results[base]["model_flops"]
        r["time_over_xla_flops"] = r["paired_ratio"] / r["xla_flops_ratio"]
    rows = [(name, f"{r['n_params'] / 1e6:.1f}M", r["step_s"]["median"] * 1e3, r["paired_ratio"], r["model_flops_ratio"],
             r["xla_flops_ratio"], r["time_over_xla_flops"]) for name, r in results.items()]
    show(f"moe_small vs gpt_small: train step, batch {args.batch_size} x 256 (interleaved, {args.rounds} windows of 2 steps)",
         ["side", "params", "step ms", "time / gpt_small (paired)", "model FLOPs / gpt_small",
          "XLA FLOPs / gpt_small", "time ratio / XLA FLOPs ratio"], rows,
         note="time ratio / XLA FLOPs ratio: 1 if the step costs what its FLOPs do")
    save("moe", {"batch_size": args.batch_size, "rounds": args.rounds, "sides": results})


if __name__ == "__main__":
    main()
