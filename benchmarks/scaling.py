"""Scaling on 8 simulated CPU devices: step time and bytes per device for data parallelism,
FSDP, tensor parallelism and their mixes.

The process gives itself 8 host devices (XLA_FLAGS, set before JAX starts). Every layout
trains the same model from the same initial parameters on the same batches, interleaved a few
steps at a time, so their step times compare and their losses must agree. 8 devices share
this machine's cores: the step times show what sharding costs in collectives and copies, not
a speed-up.

    python benchmarks/scaling.py [--rounds N]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# everything else after: JAX reads the device count when it starts

import argparse
import time

import jax
from common import device_batch, experiment, interleaved, make_run, save, show, spread

from theseus.training.metrics import format_bytes
from theseus.training.state import bytes_per_device

# gpt_tiny widened so that every axis splits 8 ways (8 heads, d_model 128, 16 sequences)
MODEL = [*experiment("gpt_tiny"), "architecture.n_heads=8", "architecture.d_model=128", "trainer.batch_size=16"]
LAYOUTS = {  # name -> (data, fsdp, tensor)
    "data 8": (8, 1, 1),
    "fsdp 8": (1, 8, 1),
    "tensor 8": (1, 1, 8),
    "data 2 x fsdp 4": (2, 4, 1),
    "data 4 x tensor 2": (4, 1, 2),
    "fsdp 4 x tensor 2": (1, 4, 2),
    "data 2 x fsdp 2 x tensor 2": (2, 2, 2),
}
STEPS = 3  # steps per timed call


class Layout:
    """One mesh layout: its assembled run, compiled step, state and loader."""

    def __init__(self, data: int, fsdp: int, tensor: int):
        self.run = make_run([*MODEL, f"mesh.data={data}", f"mesh.fsdp={fsdp}", f"mesh.tensor={tensor}"])
        self.compiled = self.run.compiled
        self.state = self.compiled.init()
        s = self.run.settings.trainer
        self.loader = self.run.dataset.loader("train", self.run.model.seq_len, s.batch_size, seed=0,
                                              prefetch=self.run.prefetch)
        self.key = jax.random.key(s.seed + 1)
        self.loss = float("nan")

    def steps(self) -> float:
        """Seconds per step over STEPS steps."""
        began = time.perf_counter()
        for _ in range(STEPS):
            tokens = device_batch(self.run, next(self.loader))
            self.state, metrics = self.compiled.step(self.state, tokens, self.key)
        self.loss = float(metrics["loss"])
        return (time.perf_counter() - began) / STEPS

    def memory(self) -> dict[str, int]:
        target = self.compiled.target
        return {"params": bytes_per_device(target.params), "opt_state": bytes_per_device(target.opt_state),
                "xla_temp": self.compiled.memory.get("temp", 0), "xla_total": self.compiled.memory.get("total", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="timed calls per layout")
    args = parser.parse_args()
    assert jax.device_count() == 8, f"expected 8 simulated devices, got {jax.device_count()}"
    layouts = {name: Layout(*shape) for name, shape in LAYOUTS.items()}
    for layout in layouts.values():  # warm up: first calls allocate and fill caches
        layout.steps()
    samples = interleaved({name: layout.steps for name, layout in layouts.items()}, args.rounds)
    base = spread(samples["data 8"])["median"]
    results = {name: {"mesh": dict(zip(("data", "fsdp", "tensor"), LAYOUTS[name], strict=True)),
                      "step_s": spread(samples[name]), "vs_data": spread(samples[name])["median"] / base,
                      "bytes_per_device": layout.memory(), "loss": layout.loss, "samples": samples[name]}
               for name, layout in layouts.items()}
    losses = [r["loss"] for r in results.values()]
    rows = [(name, r["step_s"]["median"] * 1e3, r["vs_data"], format_bytes(r["bytes_per_device"]["params"]),
             format_bytes(r["bytes_per_device"]["opt_state"]), format_bytes(r["bytes_per_device"]["xla_temp"]),
             format_bytes(r["bytes_per_device"]["xla_total"]), f"{r['loss']:.6f}") for name, r in results.items()]
    show(f"scaling on 8 simulated CPU devices ({' '.join(MODEL)})",
         ["mesh", "step ms", "vs data 8", "params / dev", "opt state / dev", "XLA temp / dev", "XLA total / dev",
          f"loss after {STEPS * (args.rounds + 1)} steps"], rows,
         note=f"losses agree within {max(losses) - min(losses):.2e} (same init, same batches)")
    save("scaling", {"model": MODEL, "steps_per_call": STEPS, "rounds": args.rounds, "layouts": results})


if __name__ == "__main__":
    main()
