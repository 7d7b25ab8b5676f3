"""A 1.3B-parameter dry run (24 layers, d_model 2048, seq 2048, scanned layers) on 8 simulated
CPU devices with ``mesh.fsdp=8``: parameter and optimizer bytes per device against total / 8,
and XLA's memory per device and compile time for each ``architecture.remat`` policy.
Compiles only, allocates nothing.

    python benchmarks/large_dry_run.py [--layers 24 --d-model 2048 --seq 2048 --devices 8]

The simulated devices are the trainer's own: ``mesh.cpu_devices``.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
from common import build, make_run, save, show, stopwatch

from theseus.plan.memory import fit_of
from theseus.training.metrics import format_bytes
from theseus.training.state import bytes_per_device, n_params

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("--layers", type=int, default=24)
ARGS.add_argument("--d-model", type=int, default=2048)
ARGS.add_argument("--heads", type=int, default=16)
ARGS.add_argument("--seq", type=int, default=2048)
ARGS.add_argument("--vocab", type=int, default=50304)
ARGS.add_argument("--devices", type=int, default=8)
ARGS.add_argument("--policies", nargs="+", default=["none", "dots", "full"])


def dry_run(args: argparse.Namespace, policy: str) -> dict:
    """Assemble and build one policy's run; its bytes per device, XLA memory and compile seconds."""
    n = args.devices
    overrides = ["+experiment=gpt_tiny", "data.tokenizer=byte", f"architecture.n_layers={args.layers}",
                 f"architecture.d_model={args.d_model}", f"architecture.n_heads={args.heads}",
                 f"architecture.seq_len={args.seq}", f"architecture.vocab_size={args.vocab}",
                 "architecture.scan_layers=true", f"architecture.remat={policy}", f"mesh.cpu_devices={n}",
                 "mesh.data=1", f"mesh.fsdp={n}", f"trainer.batch_size={n}", "trainer.grad_accum=1"]
    run = make_run(overrides, steps=None)  # the build timed alone below
    seconds, compiled = stopwatch(lambda: build(run))
    params, opt = compiled.target.params, compiled.target.opt_state
    fit = fit_of(dataclasses.replace(run, compiled=compiled))  # advice estimated, not compiled
    total = {"params": 4 * n_params(params), "opt_state": sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(opt))}
    per_device = {"params": bytes_per_device(params), "opt_state": bytes_per_device(opt)}
    return {"n_params": n_params(params), "devices": jax.device_count(), "compile_s": seconds,
            "memory": compiled.memory, "total_bytes": total, "bytes_per_device": per_device,
            "per_device_over_share": {k: per_device[k] / (total[k] / n) for k in total},
            "fits": fit.fits, "advice": fit.advice}


def main() -> None:
    args = ARGS.parse_args()
    results = {"args": vars(args), "policies": {}}
    for policy in args.policies:
        results["policies"][policy] = dry_run(args, policy)
        save("large_dry_run", results)
    first = next(iter(results["policies"].values()))
    show(f"dry run: {first['n_params'] / 1e9:.2f}B parameters, {args.layers} layers, d_model {args.d_model}, "
         f"seq {args.seq}, mesh fsdp={first['devices']}", ["remat", "params / device", "optimizer / device",
                                                           "vs total / devices", "XLA temp", "XLA total", "compile s"],
         [(policy, format_bytes(r["bytes_per_device"]["params"]), format_bytes(r["bytes_per_device"]["opt_state"]),
           " ".join(f"{v:.4f}" for v in r["per_device_over_share"].values()), format_bytes(r["memory"]["temp"]),
           format_bytes(r["memory"]["total"]), r["compile_s"]) for policy, r in results["policies"].items()],
         note="target: bytes per device within 2% of total / devices; compile < 120 s")
    save("large_dry_run", results)


if __name__ == "__main__":
    main()
