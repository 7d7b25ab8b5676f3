"""The attached accelerator (a TPU or GPU): training steps' MFU, generation, a checkpoint's save
and compile times, each configuration built, measured and freed before the next (a 16 GiB chip
holds one at a time), the planner's prediction of the same compiled step beside each.

    python benchmarks/accelerator.py                               # every section
    python benchmarks/accelerator.py --sections train --models gpt2_124m --batches 24 32

Sections: ``train`` (each model's step: median of ``--rounds`` windows, tokens/s, MFU by
theseus's count and by 6N + 12·L·d·T, XLA's temporaries, the planner's prediction of the
same program and its error against the step), ``generate`` (decoding tokens/s at batch 1 and 8, and a
GRPO-sized rollout of 64 completions), ``checkpoint`` (the seconds a save holds the loop, and
until it is on disk), ``build`` (a train step's first compile and its compile from the
persistent cache, each in a fresh process), ``attention`` (splash's forward and backward alone at
GPT-2 124M's shape, at each block size, fused backward or not: the cost of a kernel's grid step
the planner assumes, measured). Try it small on a CPU:
``--models gpt_tiny --sections train build --rounds 2``.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from common import child, device_batch, experiment, make_run, save, show, spread

from theseus.training.metrics import format_bytes

STEPS = 10  # steps per timed window
SMOLLM2 = ["+experiment=llama_small", "architecture.n_layers=30", "architecture.d_model=576", "architecture.n_heads=9",
           "architecture.n_kv_heads=3", "architecture.d_ff=1536", "architecture.vocab_size=49152",
           "architecture.tie_embeddings=true", "architecture.rope_theta=100000", "architecture.seq_len=2048"]
MODELS = {  # name -> overrides; every one on bytes as tokens (no BPE to fit: the shapes are the model's)
    "gpt_tiny": [*experiment("gpt_tiny")],
    "gpt_small": [*experiment("gpt_small")],  # the README's main job, at its batch
    "gpt2_124m": [*experiment("gpt2_124m"), "data.tokenizer=byte", "trainer.batch_size=16", "trainer.grad_accum=1"],
    "llama_small": [*experiment("llama_small")],
    "smollm2_135m": [*SMOLLM2, "trainer.batch_size=8"],  # SmolLM2-135M's shape, a full fine-tune's step
    "smollm2_135m_lora": [*SMOLLM2, "trainer.batch_size=8", "architecture.lora.rank=8"],  # LoRA on q, v
}
ACCELERATOR = ["architecture.dtype.activation=bfloat16"]  # what auto gives on a chip; said, so a CPU try matches


def train(name: str, overrides: list[str], rounds: int) -> dict:
    """One model's train step: built, timed over ``rounds`` windows, predicted; then freed."""
    began = time.perf_counter()
    run = make_run([*overrides, *ACCELERATOR])
    built = time.perf_counter() - began
    compiled, s = run.compiled, run.settings.trainer
    state = compiled.init()
    loader = run.dataset.loader("train", run.model.seq_len, s.batch_size, seed=0)
    batch = device_batch(run, next(loader))
    loader.close()
    key = jax.random.key(0)

    def step():
        nonlocal state
        state, metrics = compiled.step(state, batch, key)
        return metrics

    per_call(step, 2)  # first executions: autotuning, allocation
    samples = [per_call(step) for _ in range(rounds)]
    step_s = spread(samples)["median"]
    peak, source = run.peak
    devices = jax.device_count()
    m = run.model
    params = sum(x.size for x in jax.tree.leaves(state.params))
    tokens = run.tokens_per_step
    textbook = (6 * params + 12 * m.n_layers * m.d_model * m.seq_len) * tokens  # 6N + 12·L·d·T per token
    prediction = predicted(run)
    result = {"overrides": overrides, "build_s": built, "compile_s": compiled.seconds, "step_s": step_s,
              "samples": samples, "tokens_per_s": tokens / step_s, "params": params,
              "mfu": run.flops_per_step / step_s / (peak * devices), "mfu_6n": textbook / step_s / (peak * devices),
              "flops_per_step": run.flops_per_step, "xla_flops": compiled.xla_flops, "peak_flops": peak,
              "peak_source": source, "xla_memory": compiled.memory, **prediction}
    del state, batch, run, compiled
    gc.collect()
    return result


def per_call(call: Callable[[], Any], calls: int = STEPS) -> float:
    """Seconds per call of ``calls`` calls in a row, the last one's result waited for."""
    start = time.perf_counter()
    for _ in range(calls):
        out = call()
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls


def predicted(run) -> dict:
    """The planner's prediction of the compiled step on this chip (``theseus.plan.predict``: each
    instruction's roofline, summed), and what it is made of."""
    from theseus.base.hardware import lookup
    from theseus.plan.predict import Hardware, predict

    chip = lookup(jax.devices()[0].device_kind)
    if chip is None or chip.hbm_bandwidth is None:
        return {}
    hardware = Hardware.of(chip.name, peak=run.peak[0], bandwidth=chip.hbm_bandwidth, interconnect=chip.interconnect)
    p = predict(run.compiled.step, hardware, flops_per_device=run.flops_per_step / jax.device_count(),
                loop_trips=run.settings.trainer.grad_accum)
    return {"predicted_step_s": p.step_s, "predicted_bound": p.bound, "predicted_compute_s": p.compute_s,
            "predicted_memory_s": p.memory_s, "predicted_kernel_steps_s": p.kernel_steps_s,
            "predicted_collective_s": p.collective_s, "traffic_bytes": p.accessed}


def generate(overrides: list[str], rounds: int, new_tokens: int = 128) -> dict:
    """Decoding tokens/s of ``theseus.model.generate.complete`` at batch 1 and 8 (greedy, a 64-token
    prompt) and a rollout of 64 sampled completions (GRPO's 8 prompts x 8 generations)."""
    from theseus.model.generate import complete
    from theseus.model.sampling import Sampling

    run = make_run([*overrides, *ACCELERATOR], steps=None)
    params = run.compiled.init().params
    results = {}
    for name, batch, sampling in (("batch 1", 1, Sampling(0.0)), ("batch 8", 8, Sampling(0.0)),
                                  ("rollout 64", 64, Sampling(1.0, None, 1.0))):
        prompts = np.random.default_rng(0).integers(1, 200, (batch, 64), dtype=np.int32)
        lengths = np.full(batch, 64, np.int32)

        def once() -> float:
            start = time.perf_counter()
            out = complete(run.model, params, prompts, lengths, new_tokens, sampling)
            jax.block_until_ready(out.tokens)
            return time.perf_counter() - start

        first = once()  # compiles
        seconds = spread([once() for _ in range(rounds)])["median"]
        results[name] = {"batch": batch, "new_tokens": new_tokens, "first_s": first, "seconds": seconds,
                         "tokens_per_s": batch * new_tokens / seconds}
    del params, run
    gc.collect()
    return results


def checkpoint(overrides: list[str], rounds: int) -> dict:
    """Seconds ``Checkpointer.save`` holds the loop, and until the checkpoint is on disk."""
    from theseus.training.checkpoint import Checkpointer

    run = make_run([*overrides, *ACCELERATOR], steps=None)
    state = run.compiled.init()
    held, total = [], []
    with tempfile.TemporaryDirectory() as folder:
        saver = Checkpointer(Path(folder), keep=1)
        for step in range(1, rounds + 2):
            start = time.perf_counter()
            saver.save(step, state, {"position": step}, {})
            returned = time.perf_counter()
            saver.wait()
            if step > 1:  # the first compiles the transfers
                held.append(returned - start)
                total.append(time.perf_counter() - start)
        saver.close()
    size = sum(x.nbytes for x in jax.tree.leaves(state))
    del state, run
    gc.collect()
    return {"bytes": size, "held_s": spread(held)["median"], "written_s": spread(total)["median"]}


def build_once(name: str) -> dict:
    """(in a fresh process) seconds to compile ``name``'s train step, with this process's cache."""
    run = make_run([*MODELS[name], *ACCELERATOR])
    return {"compile_s": run.compiled.seconds, "device": jax.devices()[0].device_kind}


def builds(name: str) -> dict:
    """A train step's first compile, and its compile from the persistent cache the first filled,
    each in a process of its own (the one process a TPU admits at a time: never this one)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache}
        first = child(__file__, "--build-once", name, env=env)
        cached = child(__file__, "--build-once", name, env=env)
    return {"first_s": first["compile_s"], "cached_s": cached["compile_s"], "device": first["device"]}


ATTENTION = (16, 1024, 12, 64)  # GPT-2 124M's attention at batch 16: batch, seq, heads, head_dim


def attention_case(q, k, v, w, fused: bool, interpret: bool, hardware, rounds: int) -> dict:
    """One program of ``attention``: the gradient of splash at ``splash.BLOCKS``'s block, timed."""
    from theseus.model import splash
    from theseus.plan.predict import BACKWARD, COUNTED, DQ, FUSED_BACKWARD, SPLASH, predict

    batch, seq, heads, dim = q.shape
    block = splash.block_size(seq)

    def loss(q, k, v):
        out = splash.splash_attention(q, k, v, None, scale=dim**-0.5, fused_backward=fused, interpret=interpret)
        return (out.astype(jnp.float32) * w).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
    per_call(lambda: grad(q, k, v), 2)
    seconds = spread([per_call(lambda: grad(q, k, v)) for _ in range(rounds)])["median"]
    pairs = splash.computed_pairs(seq, None) * batch * heads
    kernels = dict(SPLASH)  # kernel -> products a pair, as the planner counts them
    if fused:  # the dkv kernel computes dq too
        del kernels[DQ]
        kernels[BACKWARD] = FUSED_BACKWARD
    products = pairs * sum(kernels.values())
    counted = COUNTED * pairs * 2 * dim  # theseus's count
    return {"block": block, "fused": fused, "seconds": seconds, "kernel_flops": products * 2 * dim,
            "grid_steps": batch * heads * (seq // block) ** 2 * len(kernels),
            "predicted_s": predict(grad, hardware, flops_per_device=counted).step_s if hardware else None}


def attention(rounds: int) -> dict:
    """Splash's forward and backward (``jax.grad`` of one layer's attention) at ``ATTENTION``'s
    shape, at each of its block sizes, the backward fused or not; each program's seconds beside
    its grid steps and the products its kernels compute, and the fit of seconds = products at a
    rate + grid steps x a cost each (the planner's ``KERNEL_STEP_S``, and its prediction beside)."""
    from theseus.base.hardware import lookup
    from theseus.model import splash
    from theseus.plan.predict import Hardware

    batch, seq, heads, dim = ATTENTION
    q, k, v, w = (jax.random.normal(key, (batch, seq, heads, dim), jnp.bfloat16) for key in
                  jax.random.split(jax.random.key(0), 4))
    chip = lookup(jax.devices()[0].device_kind)
    hardware = (Hardware.of(chip.name, peak=chip.bf16, bandwidth=chip.hbm_bandwidth, interconnect=chip.interconnect)
                if chip is not None and chip.hbm_bandwidth else None)
    blocks, results = splash.BLOCKS, {}
    interpret = jax.default_backend() != "tpu"  # a try on a CPU: Pallas's interpreter (slow)
    try:
        for block in (seq, *blocks):  # one block of the whole sequence (every pair), then splash's own
            splash.BLOCKS = (block,)  # the kernel's and the planner's block, this measurement's
            for fused in (False, True):
                name = f"block {block}{' fused' if fused else ''}"
                try:
                    results[name] = attention_case(q, k, v, w, fused, interpret, hardware, rounds)
                except Exception as exc:  # noqa: BLE001  (recorded: a block the chip's VMEM does not hold)
                    results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        splash.BLOCKS = blocks
    rows = [r for r in results.values() if "seconds" in r]
    # seconds = flops / rate + steps x cost: a least-squares fit over every block size and kernel
    fit, *_ = np.linalg.lstsq(np.array([[r["kernel_flops"], r["grid_steps"]] for r in rows]),
                              np.array([r["seconds"] for r in rows]), rcond=None)
    return {"shape": ATTENTION, "cases": results, "fit_rate_flops": 1 / fit[0] if fit[0] > 0 else None,
            "fit_step_s": float(fit[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", default=["train", "generate", "checkpoint", "build"],
                        choices=["train", "generate", "checkpoint", "build", "attention"])
    parser.add_argument("--models", nargs="+", default=["gpt_small", "gpt2_124m", "llama_small", "smollm2_135m",
                                                        "smollm2_135m_lora"], choices=list(MODELS))
    parser.add_argument("--batches", type=int, nargs="*", default=[], help="also the first model at these batch sizes")
    parser.add_argument("--set", nargs="*", default=[], help="overrides added to every model (e.g. a kernel's key)")
    parser.add_argument("--rounds", type=int, default=5, help="timed windows (calls) per measurement")
    parser.add_argument("--build-once", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_once:
        print(__import__("json").dumps(build_once(args.build_once)))
        return
    results: dict = {"set": args.set}
    if "build" in args.sections:  # first: its processes take the chip, which this one holds from its first step on
        results["build"] = {name: builds(name) for name in args.models[:2]}
    device = results["device"] = jax.devices()[0].device_kind
    if "build" in args.sections:
        save("accelerator", results)
        show(f"train step compile on {device}", ["model", "first s", "from the cache s"],
             [(n, r["first_s"], r["cached_s"]) for n, r in results["build"].items()])
    cases = {name: [*MODELS[name], *args.set] for name in args.models}
    first = args.models[0]
    cases.update({f"{first} batch {b}": [*MODELS[first], f"trainer.batch_size={b}", *args.set] for b in args.batches})
    if "train" in args.sections:
        results["train"] = {}
        for name, overrides in cases.items():
            try:
                results["train"][name] = train(name, overrides, args.rounds)
            except Exception as exc:  # noqa: BLE001  (recorded: a configuration that does not fit must not end the run)
                results["train"][name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            save("accelerator", results)
        rows = [(name, r["step_s"] * 1e3, f"{r['tokens_per_s']:,.0f}", f"{100 * r['mfu']:.1f}%",
                 f"{100 * r['mfu_6n']:.1f}%", *(  # no prediction for a chip the hardware table lacks (a CPU)
                     (f"{r['predicted_step_s'] * 1e3:.1f} ({r['predicted_bound']})",
                      f"{100 * (r['predicted_step_s'] / r['step_s'] - 1):+.0f}%", format_bytes(r["traffic_bytes"]))
                     if "predicted_step_s" in r else ("-", "-", "-")),
                 format_bytes(r["xla_memory"].get("temp", 0)), r["build_s"])
                if "step_s" in r else (name, "-", "-", r["error"][:60], "-", "-", "-", "-", "-", "-")
                for name, r in results["train"].items()]
        show(f"train steps on {device} (median of {args.rounds} windows of {STEPS} steps)",
             ["model", "step ms", "tokens/s", "MFU", "MFU 6N+12LdT", "predicted ms", "predicted error", "HBM bytes",
              "XLA temp", "build s"], rows)
    if "generate" in args.sections:
        results["generate"] = generate([*MODELS["smollm2_135m"], *args.set], args.rounds)
        save("accelerator", results)
        show(f"generation on {device}: SmolLM2-135M's shape, 64-token prompts, 128 new tokens",
             ["case", "tokens/s", "seconds", "first call s"],
             [(n, f"{r['tokens_per_s']:,.0f}", r["seconds"], r["first_s"]) for n, r in results["generate"].items()])
    if "checkpoint" in args.sections:
        saved = [name for name in ("gpt2_124m", "gpt_small") if name in cases] or list(cases)[:1]
        results["checkpoint"] = {name: checkpoint(cases[name], args.rounds) for name in saved}
        save("accelerator", results)
        show(f"checkpoint saves on {device}", ["model", "state", "loop held s", "on disk s"],
             [(n, format_bytes(r["bytes"]), r["held_s"], r["written_s"]) for n, r in results["checkpoint"].items()])
    if "attention" in args.sections:
        results["attention"] = attention(args.rounds)
        save("accelerator", results)
        fit = results["attention"]
        show(f"splash forward + backward on {device}, {ATTENTION} (batch, seq, heads, head_dim): a grid step "
             f"{fit['fit_step_s'] * 1e6:.3f} us, products at {(fit['fit_rate_flops'] or 0) / 1e12:.1f} TFLOP/s (fit)",
             ["case", "ms", "grid steps", "kernel TFLOP", "predicted ms"],
             [(n, r["seconds"] * 1e3, r["grid_steps"], r["kernel_flops"] / 1e12,
               "-" if r["predicted_s"] is None else r["predicted_s"] * 1e3) if "seconds" in r
              else (n, r["error"][:60], "-", "-", "-") for n, r in fit["cases"].items()])


if __name__ == "__main__":
    main()
