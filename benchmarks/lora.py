"""LoRA: a LoRA step against a full fine-tune step of the same model, and against the LoRA step
that differentiated the whole tree (before the step took the trainable params alone).

``gpt_small`` three ways through the trainer's own loop (``overhead.TheseusLoop``), interleaved a
log window at a time in one process: every weight training; rank-8 adapters on q, k, v, o (the
base frozen), the step differentiating the adapters alone (``optimizer.trainable``); and the
same LoRA run whose step differentiates every parameter and lets the optimizer zero the base's
update (``train_step(trainable=None)``, the step before). Reported: each one's step time against
the full fine-tune's (the median of paired ratios) and XLA's FLOPs and bytes of each compiled step.

    python benchmarks/lora.py [--batch-size 4] [--rounds 6]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from unittest import mock

import jax
import numpy as np
from common import build, interleaved, make_run, program_cost, save, show, spread
from overhead import TheseusLoop

LORA = ["architecture.lora.rank=8", "architecture.lora.targets=[q,k,v,o]"]
SIDES = {"full fine-tune": [], "LoRA": LORA, "LoRA, whole-tree gradient": LORA}
BASE = "full fine-tune"


def whole_tree_gradient(run):
    """``run`` with its train step compiled without a trainable mask: every parameter differentiated."""
    from theseus.training import compiled

    with mock.patch.object(compiled, "trainable", None):
        return dataclasses.replace(run, compiled=build(run))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="gpt_small", help="the model (an experiment)")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    parser.add_argument("--rounds", type=int, default=6, help="log windows of 2 steps per side")
    args = parser.parse_args()
    common = [f"+experiment={args.experiment}", f"trainer.batch_size={args.batch_size}", "trainer.log_every=2",
              "trainer.grad_accum=1", f"trainer.max_steps={2 * (args.rounds + 2)}"]
    with tempfile.TemporaryDirectory() as runs:
        loops = {}
        for i, (name, overrides) in enumerate(SIDES.items()):
            run = make_run([*common, *overrides])
            loops[name] = TheseusLoop(whole_tree_gradient(run) if "whole-tree" in name else run, Path(runs) / str(i))
        for loop in loops.values():
            loop.window()  # warm-up
        samples = interleaved({name: (lambda loop=loop: loop.window()[0]) for name, loop in loops.items()},
                              args.rounds)
    results = {}
    for name, loop in loops.items():
        cost = program_cost(loop.compiled.step)
        trained = sum(int(np.prod(p.shape)) for path, p in jax.tree_util.tree_leaves_with_path(loop.state.params)
                      if not SIDES[name] or "lora_" in jax.tree_util.keystr(path))
        results[name] = {"overrides": [*common, *SIDES[name]], "step_s": spread(samples[name]),
                         "paired_ratio": float(np.median(np.divide(samples[name], samples[BASE]))),
                         "xla_flops": cost["flops"], "xla_bytes": cost["bytes_accessed"], "trained_params": trained,
                         "samples": samples[name]}
    for r in results.values():
        r["xla_flops_ratio"] = r["xla_flops"] / results[BASE]["xla_flops"]
        r["xla_bytes_ratio"] = r["xla_bytes"] / results[BASE]["xla_bytes"]
    rows = [(name, f"{r['trained_params'] / 1e6:.2f}M", r["step_s"]["median"] * 1e3, r["paired_ratio"],
             r["xla_flops_ratio"], r["xla_bytes_ratio"]) for name, r in results.items()]
    show(f"LoRA vs full fine-tune: {args.experiment}'s train step, batch {args.batch_size} (interleaved, "
         f"{args.rounds} windows of 2 steps)",
         ["side", "trained params", "step ms", "time / full (paired)", "XLA FLOPs / full", "XLA bytes / full"], rows)
    save("lora", {"experiment": args.experiment, "batch_size": args.batch_size, "rounds": args.rounds,
                  "sides": results})


if __name__ == "__main__":
    main()
