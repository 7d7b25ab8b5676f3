"""Scale knobs on the CPU: XLA's memory per device of gpt2_124m's train step for each
``architecture.remat`` policy, unrolled and scanned, and the compile time of a 24-layer
model with ``architecture.scan_layers`` against unrolled. Compiles only, runs nothing.

    python benchmarks/scale.py [--memory-size gpt2_124m] [--compile-layers 24]

Memory: the dry run's figures (``assemble(resolve(cfg)).compiled.memory``) at the experiment's batch
(256 sequences of 1024, grad_accum 4). Compile: the build of the state's layout and the train
and eval steps (``compile_steps``, as ``theseus.recipe.assemble`` does) of gpt_small's width at
``--compile-layers`` layers, each side twice, interleaved, fresh caches.
"""

from __future__ import annotations

import argparse

import jax
from common import build, experiment, interleaved, make_run, save, show, spread, stopwatch

from theseus.training.metrics import format_bytes

POLICIES = ("none", "dots", "full")
BYTES = ["data.tokenizer=byte"]  # a declared vocab_size fixes the shapes: no BPE to fit to compile


def memory(size: str, batch: list[str]) -> dict[str, dict]:
    """``{"unrolled none": {"temp": bytes, "total": bytes, "compile_s": s}, ...}``."""
    out = {}
    for scan in (False, True):
        for policy in POLICIES:
            name = f"{'scanned' if scan else 'unrolled'} {policy}"
            overrides = [*experiment(size), *BYTES, *batch, f"architecture.remat={policy}",
                         f"architecture.scan_layers={str(scan).lower()}"]
            seconds, compiled = stopwatch(lambda o=overrides: make_run(o).compiled)  # assembled: compiled
            out[name] = {**compiled.memory, "compile_s": seconds}
            print(name, format_bytes(compiled.memory["temp"]), f"{seconds:.0f} s", flush=True)
    return out


def compile_times(layers: int, rounds: int) -> dict:
    """Build seconds of a ``layers``-deep gpt_small, unrolled and scanned (interleaved)."""
    base = [*experiment("gpt_small"), *BYTES, f"architecture.n_layers={layers}"]

    def side(scan: bool):
        run = make_run([*base, f"architecture.scan_layers={str(scan).lower()}"], steps=None)

        def rebuild() -> float:  # the layout, lowering and compiling the train and eval steps
            jax.clear_caches()
            return stopwatch(lambda: build(run))[0]
        return rebuild

    samples = interleaved({"unrolled": side(False), "scanned": side(True)}, rounds)
    medians = {name: spread(values)["median"] for name, values in samples.items()}
    return {"layers": layers, "samples": samples, **{f"{k}_s": v for k, v in medians.items()},
            "ratio": medians["unrolled"] / medians["scanned"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-size", default="gpt2_124m")
    parser.add_argument("--batch", nargs="*", default=["trainer.batch_size=256", "trainer.grad_accum=4"],
                        help="overrides of the memory table's batch (default: gpt2_124m's)")
    parser.add_argument("--compile-layers", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results = {"memory_size": args.memory_size, "memory": memory(args.memory_size, args.batch)}
    save("scale", results)
    results["compile"] = compile_times(args.compile_layers, args.rounds)
    show(f"XLA memory per device, {args.memory_size} train step ({' '.join(args.batch)})",
         ["layers, remat", "temp", "total", "compile s"],
         [(name, format_bytes(v["temp"]), format_bytes(v["total"]), v["compile_s"])
          for name, v in results["memory"].items()])
    c = results["compile"]
    show(f"compile time, {c['layers']}-layer gpt_small (median of {args.rounds})", ["layers", "build s"],
         [("unrolled", c["unrolled_s"]), ("scanned", c["scanned_s"]), ("ratio", c["ratio"])], note="target: >= 3x")
    save("scale", results)


if __name__ == "__main__":
    main()
