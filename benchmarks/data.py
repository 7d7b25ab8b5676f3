"""Data: the loader's throughput (tokens/s) against what training consumes, per process.

For each job's batch shape: the bare gather (``Windows.batch``, on the calling thread), the
loader as the trainer sees it (``next()``, fed by its prefetching thread), and that plus the
global device array the trainer builds from each batch. Every source reads memory-mapped token
shards (stdlib's are prepared into the cache); the mixture draws each sequence from one of two
by weight. Demand is the most one process could eat: its devices' tokens/s at 100% MFU, on this
machine (gpt_small, the measured CPU peak), and for the largest shipped experiment (gpt2_124m)
on the target whose process drives the most FLOP/s: a B200 node (``gpu:b200x8``, one process
for its 8 GPUs; a TPU host has 4 or 8 chips of at most 918 TFLOP/s), bf16 from the peak table.

    python benchmarks/data.py [--seconds S]
"""

from __future__ import annotations

import argparse
import time

import jax
from common import device_batch, experiment, make_run, save, show

from theseus.base.axis import MESH_AXES
from theseus.base.hardware import lookup

# job -> (overrides, (device kind, devices per process) for demand; None: this machine's).
# Bytes as tokens: the loader gathers the same int windows whatever the tokenizer.
GPT2 = [*experiment("gpt2_124m"), "data.tokenizer=byte"]
NODE = ("NVIDIA B200", 8)
JOBS = {
    "gpt_small": (experiment("gpt_small"), None),
    "gpt2_124m": (GPT2, NODE),
    "gpt2_124m mixture": ([*GPT2, "data.mixture={a: {source: stdlib, weight: 0.7}, b: {source: stdlib, weight: 0.3}}"],
                          NODE),
}


def rate(fetch, tokens_per_call: int, seconds: float) -> float:
    """Tokens/s of calling ``fetch`` repeatedly for about ``seconds``."""
    calls, began = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - began) < seconds:
        fetch()
        calls += 1
    return calls * tokens_per_call / elapsed


def measure(job: str, seconds: float) -> dict:
    overrides, demand_on = JOBS[job]
    run = make_run(overrides, steps=None)  # the data and model; no step compiled
    s = run.settings.trainer
    loader = run.dataset.loader("train", run.model.seq_len, s.batch_size, seed=run.settings.data.seed)
    mesh = jax.make_mesh((1,) * len(MESH_AXES), MESH_AXES)
    windows, position = loader.windows, iter(range(0, 1 << 62, loader.windows.stride))
    rates = {
        "gather": rate(lambda: windows.batch(next(position)), run.tokens_per_step, seconds),
        "loader": rate(lambda: next(loader), run.tokens_per_step, seconds),
        "loader + device array": rate(lambda: jax.block_until_ready(device_batch(run, next(loader), mesh)),
                                      run.tokens_per_step, seconds),
    }
    loader.close()
    flops_per_token = run.flops_per_step / run.tokens_per_step
    kind, devices = demand_on or (jax.devices()[0].device_kind, jax.device_count())
    peak = lookup(kind).peak("bfloat16") * devices if demand_on else run.peak[0] * devices
    demand = peak / flops_per_token
    return {"batch_size": s.batch_size, "seq_len": run.model.seq_len, "tokens_per_step": run.tokens_per_step,
            "tokens_per_s": rates, "demand_device": f"{devices} x {kind}",
            "demand_tokens_per_s_at_100pct_mfu": demand,
            "headroom": {name: r / demand for name, r in rates.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per measurement")
    args = parser.parse_args()
    results = {job: measure(job, args.seconds) for job in JOBS}
    rows = [(f"{job} ({r['batch_size']}x{r['seq_len']})", name, f"{tps:,.0f}",
             f"{r['demand_tokens_per_s_at_100pct_mfu']:,.0f} ({r['demand_device']})", r["headroom"][name])
            for job, r in results.items() for name, tps in r["tokens_per_s"].items()]
    show("data: loader throughput vs what training consumes", ["job (batch x seq)", "path", "tokens/s",
                                                                "demand at 100% MFU", "headroom x"], rows)
    save("data", results)


if __name__ == "__main__":
    main()
