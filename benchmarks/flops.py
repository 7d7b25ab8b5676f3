"""FLOPs: ``model.flops(seq)`` against XLA's count of the compiled train step and against the
6N + 12·L·d·T formula, for four sizes from gpt_tiny to gpt2_124m. Compiles only, runs nothing.

XLA's count is ``Trainer.build()``'s: cost_analysis of the train step, which counts one
device's share and a scan's body once, scaled back to all devices and micro-batches. It
includes what the analytic count leaves out (norms, softmax, GELU, the loss, AdamW), so it
sits a little above. The matmul column walks the jaxpr of forward + backward and adds up
every ``dot_general`` (2 x output size x contracted size): exactly what the analytic
convention counts, so it should match ``model.flops`` to the FLOP. The formula is nanoGPT's/PaLM's per token: 6N + 12·L·d·T, with N the
parameters less the position embedding (the tied token embedding counts: it is the head).

    python benchmarks/flops.py [--sizes gpt_tiny gpt_small ...]
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
from common import SIZES, experiment, make_trainer, save, show, stand_in, stopwatch
from jax.extend.core import jaxprs_in_params

from theseus.model.models.gpt import cross_entropy

# FLOPs of one sequence; bytes as tokens (a declared vocab_size fixes the shapes, and no BPE
# needs fitting to compile gpt2_124m)
PER_SEQUENCE = ["trainer.batch_size=1", "trainer.grad_accum=1", "data.tokenizer=byte"]


def formula(trainer, params) -> int:
    """6N + 12·L·d·T per token, times T tokens."""
    model, seq = trainer.model, trainer.seq_len
    n = sum(math.prod(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(params)
            if "wpe" not in jax.tree_util.keystr(path))
    return (6 * n + 12 * model.n_layers * model.d_model * seq) * seq


def matmul_flops(trainer, params) -> int:
    """FLOPs of every matrix product in forward + backward of one sequence, from the jaxpr."""
    tokens = jax.ShapeDtypeStruct((1, trainer.seq_len + 1), jnp.int32)

    def loss(p, t):
        return cross_entropy(trainer.model.apply({"params": p}, t[:, :-1]), t[:, 1:])

    return _dot_flops(jax.make_jaxpr(jax.grad(loss))(params, tokens).jaxpr)


def _dot_flops(jaxpr) -> int:
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contracting)
        repeats = eqn.params.get("length", 1)  # a scan runs its body `length` times
        total += repeats * sum(_dot_flops(sub) for sub in jaxprs_in_params(eqn.params))
    return total


def count(size: str) -> dict:
    trainer = make_trainer([*experiment(size), *PER_SEQUENCE])
    seconds, compiled = stopwatch(trainer.build)
    params = compiled.target.params
    analytic, by_formula, matmuls = trainer.flops_per_step, formula(trainer, params), matmul_flops(trainer, params)
    m = trainer.model
    return {"stand_in": stand_in(size), "n_layers": m.n_layers, "d_model": m.d_model, "seq_len": trainer.seq_len,
            "vocab_size": m.vocab_size, "n_params": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
            "model_flops": analytic, "matmul_flops": matmuls, "xla_flops": compiled.xla_flops,
            "formula_flops": by_formula, "matmul_over_model": matmuls / analytic,
            "xla_over_model": compiled.xla_flops / analytic, "formula_over_model": by_formula / analytic,
            "compile_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    args = parser.parse_args()
    results = {size: count(size) for size in args.sizes}
    rows = [(size + (" *" if r["stand_in"] else ""), f"{r['n_params'] / 1e6:.2f}M", r["seq_len"],
             f"{r['model_flops']:.4g}", f"{r['xla_flops']:.4g}", f"{r['formula_flops']:.4g}",
             f"{r['matmul_over_model']:.6f}", r["xla_over_model"], r["formula_over_model"], r["compile_s"])
            for size, r in results.items()]
    show("FLOPs of one sequence (forward + backward): model.flops vs XLA vs 6N + 12·L·d·T",
         ["size", "params", "seq", "model.flops", "XLA", "formula", "matmuls / model", "XLA / model",
          "formula / model", "compile s"],
         rows, note="target: within 5%; * a stand-in (no experiments/NAME.yaml): overrides in benchmarks/common.py")
    save("flops", results)


if __name__ == "__main__":
    main()
