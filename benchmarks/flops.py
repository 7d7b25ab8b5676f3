"""FLOPs: ``model.flops(seq)`` against XLA's count and against the 6N + 12·L·d·T formula, for
four sizes from gpt_tiny to gpt2_124m. Compiles only, runs nothing.

``model.flops(seq)`` counts the matrix products of forward + backward of one sequence, so
each count is of that same program, the gradient of the loss of one sequence:

- XLA: ``cost_analysis()`` of the compiled program. It also counts what the analytic
  convention leaves out (norms, softmax, GELU, the loss), so it sits a little above.
- XLA dots: every ``dot`` left in the optimized HLO (2 x output size x contracted size): the
  matrix products XLA actually runs, the analytic convention exactly.
- jaxpr dots: every ``dot_general`` in the jaxpr, the same before XLA.
- formula: nanoGPT's/PaLM's 6N + 12·L·d·T per token, N the parameters less the position
  embedding (the tied token embedding counts: it is the head).
- train step: the cross-check the run logs (``run.compiled.xla_flops``, compiled by
  ``theseus.recipe.assemble``), XLA's count of the whole step at the experiment's batch; it
  adds AdamW (about 15 FLOPs a parameter a step).

    python benchmarks/flops.py [--sizes gpt_tiny gpt_small ...]
"""

from __future__ import annotations

import argparse
import math
import re

import jax
import jax.numpy as jnp
from common import SIZES, build, experiment, make_run, program_cost, save, show, stand_in, stopwatch
from jax.extend.core import jaxprs_in_params

from theseus.tasks.lm import cross_entropy

# one micro-batch, so the compiled step has no loop; bytes as tokens (a declared vocab_size
# fixes the shapes, and no BPE needs fitting to compile gpt2_124m)
ONE_MICRO_BATCH = ["trainer.grad_accum=1", "data.tokenizer=byte"]

# in optimized HLO text: every instruction's name and shape, and each dot's output shape, left
# operand and the contracted dimensions of that operand
_DEFINITION = re.compile(r"%([\w.\-]+) = \w+\[([\d,]*)\]")
_DOT = re.compile(r"= \w+\[([\d,]*)\]\S* dot\((?:\S+ )?%([\w.\-]+),.*?lhs_contracting_dims=\{([\d,]*)\}")


def gradient(run):
    """The gradient of the loss of one sequence: ``(params, tokens [1, seq + 1]) -> grads``."""
    def loss(params, tokens):
        return cross_entropy(run.model.apply({"params": params}, tokens[:, :-1]), tokens[:, 1:])

    return jax.grad(loss)


def formula(run, params) -> int:
    """6N + 12·L·d·T per token, times T tokens."""
    model, seq = run.model, run.model.seq_len
    n = sum(math.prod(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(params)
            if "wpe" not in jax.tree_util.keystr(path))
    return (6 * n + 12 * model.n_layers * model.d_model * seq) * seq


def jaxpr_dot_flops(jaxpr) -> int:
    """FLOPs of every ``dot_general`` in ``jaxpr`` and the jaxprs inside it (a scan's body
    times its length)."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contracting)
        repeats = eqn.params.get("length", 1)
        total += repeats * sum(jaxpr_dot_flops(sub) for sub in jaxprs_in_params(eqn.params))
    return total


def xla_dot_flops(compiled) -> int:
    """FLOPs of every ``dot`` XLA kept in a compiled program (one device's share). Refuses a
    program with a loop, whose body the text holds once."""
    text = compiled.as_text()
    if re.search(r"\bwhile\(", text):
        raise ValueError("the compiled program has a loop: count a program without one")
    shapes = {name: _dims(shape) for name, shape in _DEFINITION.findall(text)}
    return sum(2 * math.prod(_dims(out)) * math.prod(shapes[lhs][d] for d in _dims(contracting))
               for out, lhs, contracting in _DOT.findall(text))


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def count(size: str) -> dict:
    run = make_run([*experiment(size), *ONE_MICRO_BATCH], steps=None)  # the build timed alone below
    seconds, step = stopwatch(lambda: build(run))
    params, seq = step.target.params, run.model.seq_len
    tokens = jax.ShapeDtypeStruct((1, seq + 1), jnp.int32)
    grad = gradient(run)
    compiled = jax.jit(grad).lower(params, tokens).compile()
    analytic = run.model.flops(seq)
    counts = {"xla": program_cost(compiled)["flops"], "xla_dots": xla_dot_flops(compiled),
              "jaxpr_dots": jaxpr_dot_flops(jax.make_jaxpr(grad)(params, tokens).jaxpr),
              "formula": formula(run, params)}
    m = run.model
    return {"stand_in": stand_in(size), "n_layers": m.n_layers, "d_model": m.d_model, "seq_len": seq,
            "vocab_size": m.vocab_size, "n_params": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
            "model_flops": analytic, **{f"{k}_flops": v for k, v in counts.items()},
            **{f"{k}_over_model": v / analytic for k, v in counts.items()},
            "batch_size": run.settings.trainer.batch_size, "train_step_xla_over_model": step.xla_flops / run.flops_per_step,
            "compile_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    args = parser.parse_args()
    results = {size: count(size) for size in args.sizes}
    rows = [(size + (" *" if r["stand_in"] else ""), f"{r['n_params'] / 1e6:.2f}M", r["seq_len"],
             f"{r['model_flops']:.4g}", f"{r['xla_flops']:.4g}", r["xla_over_model"],
             f"{r['xla_dots_over_model']:.6f}", f"{r['jaxpr_dots_over_model']:.6f}", r["formula_over_model"],
             f"{r['train_step_xla_over_model']:.4f} (batch {r['batch_size']})")
            for size, r in results.items()]
    show("FLOPs of forward + backward of one sequence: model.flops vs XLA vs 6N + 12·L·d·T",
         ["size", "params", "seq", "model.flops", "XLA", "XLA / model", "XLA dots / model", "jaxpr dots / model",
          "formula / model", "train step: XLA / model"],
         rows, note="target: within 5%; * a stand-in (no experiments/NAME.yaml): overrides in benchmarks/common.py")
    save("flops", results)


if __name__ == "__main__":
    main()
