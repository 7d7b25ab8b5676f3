"""Overhead: theseus's training loop against a minimal hand-written JAX + optax loop.

Both sides train the same GPT (the same Flax module, initial parameters, dtype, batches and
AdamW settings) in one process, interleaved one log window at a time. The theseus side is
the step ``theseus.recipe.assemble`` compiles (``run.compiled``), driven by the trainer's own
loop methods (``Trainer(run).take_step``: the prefetching loader, the global batch, the step
call; ``Trainer(run).log`` at each window's end: the metrics fetch, throughput, the logger
(metrics.jsonl and the console line) and the non-finite check). The bare side is what
one writes by hand: a jitted value_and_grad + optax update, ``device_put`` of a numpy batch,
on the run's devices as theseus lays them out (the params on each, the batch split over them).
Both sides see the same stream of batches, so their losses must agree step for step.

Each comparison runs in several fresh processes and the ratio reported is the median over
them: on this shared 2-core machine now and then a whole process runs the theseus loop
10-35% slower (its compiled step, timed alone, is not; the cause is not found), which a
single process cannot tell from overhead.

    python benchmarks/overhead.py [--cases gpt_tiny gpt_small] [--rounds N] [--processes P (5)]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import tempfile
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from common import child, experiment, interleaved, make_run, program_cost, save, show, spread, stand_in
from jax.sharding import NamedSharding, PartitionSpec

from theseus.data.loader import Windows
from theseus.training.batches import batch_sharding
from theseus.training.logger import RunLogger
from theseus.training.loop import LoopState
from theseus.training.optimizer import clip_by_global_norm, decay_mask
from theseus.training.trainer import Trainer

# Settings the bare loop implements too: no dropout, a cosine schedule, no accumulation.
FAIR = ["architecture.dropout=0.0", "optimizer.schedule=cosine", "trainer.grad_accum=1"]
# name -> (experiment, extra overrides, rounds). gpt_tiny is host-bound (a step takes
# milliseconds, so per-step Python shows); gpt_small is compute-bound, its batch cut so that
# a window takes seconds, not minutes, on a 2-core CPU.
CASES = {
    "gpt_tiny": ("gpt_tiny", [], 30),
    "gpt_small": ("gpt_small", ["trainer.batch_size=4", "trainer.log_every=2"], 8),
}


class TheseusLoop:
    """``Trainer.run``'s loop, one log window per call: the trainer's own ``take_step`` and
    ``log`` hook (the other hooks, a few integer tests and a preemption flag read, left out)."""

    def __init__(self, run, run_dir: Path):
        s = run.settings.trainer
        self.run, self.trainer, self.every = run, Trainer(run), s.log_every
        self.compiled = run.compiled
        loader = run.dataset.loader("train", run.model.seq_len, s.batch_size, seed=run.settings.data.seed,
                                    prefetch=run.prefetch)
        logger = RunLogger(run.logging, run_dir, resolved_config=run.record, total_steps=s.max_steps)
        self.loop = LoopState(run_dir, self.compiled, self.compiled.init(), loader, logger, checkpointer=None,
                              dropout_key=jax.random.key(s.seed + 1), peak=run.peak[0], step=0,
                              last_step=s.max_steps)

    @property
    def state(self):
        return self.loop.state

    def window(self) -> tuple[float, float]:
        """Run one log window; ``(seconds per step, mean loss of its steps)``."""
        clock = time.perf_counter()
        for _ in range(self.every):
            self.trainer.take_step(self.loop)
        with contextlib.redirect_stdout(io.StringIO()):  # the console line, kept off this table
            self.trainer.log(self.loop)  # due: a window is log_every steps from step 0
        return (time.perf_counter() - clock) / self.every, self.loop.logged["loss"]


class BareLoop:
    """The hand-written loop: same module, init, batches and optimizer settings, nothing else."""

    def __init__(self, run):
        s, o, model = run.settings.trainer, run.settings.optimizer, run.model
        self.every = s.log_every
        tokens = jnp.zeros((1, model.seq_len), jnp.int32)
        # on the run's devices, as theseus lays them out: the params on each, the batch split over them
        self.batches = batch_sharding(run.compiled.mesh)
        replicated = NamedSharding(run.compiled.mesh, PartitionSpec())
        self.params = jax.jit(lambda: nn.unbox(model.init(jax.random.key(s.seed), tokens)["params"]),
                              out_shardings=replicated)()
        schedule = optax.warmup_cosine_decay_schedule(0.0, o.lr, o.warmup_steps, s.max_steps,
                                                      end_value=o.lr * o.min_lr_ratio)
        self.tx = optax.chain(clip_by_global_norm(o.clip_norm),  # theseus's clipping and rule of what decays
                              optax.adamw(schedule, o.b1, o.b2, o.eps, weight_decay=o.weight_decay, mask=decay_mask))
        self.opt_state = self.tx.init(self.params)
        self.step = jax.jit(functools.partial(_bare_step, model, self.tx), donate_argnums=(0, 1))
        self.windows = Windows(run.dataset.tokens["train"], model.seq_len, s.batch_size, run.settings.data.seed)
        self.position = 0

    def window(self) -> tuple[float, float]:
        """Run one log window; ``(seconds per step, mean loss of its steps)``, as theseus logs it."""
        clock, losses = time.perf_counter(), []
        for _ in range(self.every):
            batch = jax.device_put(self.windows.batch(self.position), self.batches)
            self.position += self.windows.stride
            self.params, self.opt_state, loss = self.step(self.params, self.opt_state, batch)
            losses.append(loss)
        loss = float(np.mean(np.asarray(jax.device_get(losses), np.float64)))
        return (time.perf_counter() - clock) / self.every, loss


def _bare_step(model, tx, params, opt_state, batch):
    def loss_fn(p):
        logits = model.apply({"params": p}, batch[:, :-1]).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def measure(name: str, rounds: int) -> dict:
    """Interleave the two loops for ``rounds`` windows each (after one warm-up window)."""
    exp, extra, _ = CASES[name]
    job = make_run([*experiment(exp), *extra], steps=None).settings.trainer  # the job's schedule, lengthened if too short
    every, steps = job.log_every, max(job.max_steps, (rounds + 1) * job.log_every)
    run = make_run([*experiment(exp), *extra, *FAIR, f"trainer.max_steps={steps}"])
    with tempfile.TemporaryDirectory() as run_dir:
        ours, bare = TheseusLoop(run, Path(run_dir)), BareLoop(run)
        batch = jax.device_put(bare.windows.batch(0), bare.batches)
        cost = {"theseus": program_cost(ours.compiled.step),
                "bare": program_cost(bare.step.lower(bare.params, bare.opt_state, batch).compile())}
        same_init = all(jax.tree.leaves(jax.tree.map(np.array_equal, ours.state.params, bare.params)))
        losses = {"theseus": [], "bare": []}

        def timed(loop, side):
            def call():
                seconds, loss = loop.window()
                losses[side].append(loss)
                return seconds
            return call

        warm = [timed(ours, "theseus")(), timed(bare, "bare")()]
        samples = interleaved({"theseus": timed(ours, "theseus"), "bare": timed(bare, "bare")}, rounds)
    loss_gap = max(abs(a - b) / abs(b) for a, b in zip(losses["theseus"], losses["bare"], strict=True))
    theseus, base = spread(samples["theseus"]), spread(samples["bare"])
    return {"experiment": exp, "stand_in": stand_in(exp), "overrides": [*extra, *FAIR],
            "batch_size": run.settings.trainer.batch_size, "seq_len": run.model.seq_len, "steps_per_window": every,
            "rounds": rounds, "warmup_seconds": warm, "theseus_step_s": theseus, "bare_step_s": base,
            "ratio": theseus["median"] / base["median"],
            "paired_ratio": float(np.median(np.divide(samples["theseus"], samples["bare"]))),
            "program": cost, "program_ratio": {k: cost["theseus"][k] / cost["bare"][k] for k in cost["bare"]},
            "same_init": same_init, "max_loss_rel_diff": loss_gap,
            "losses": losses, "samples": samples}


def summarize(runs: list[dict]) -> dict:
    """One case over several processes: the median of their ratios, and every process's figures."""
    first = runs[0]
    keep = ("experiment", "stand_in", "overrides", "batch_size", "seq_len", "steps_per_window", "rounds",
            "program", "program_ratio")
    return {**{k: first[k] for k in keep},
            "ratio": float(np.median([r["ratio"] for r in runs])),
            "paired_ratio": float(np.median([r["paired_ratio"] for r in runs])),
            "theseus_ms": float(np.median([r["theseus_step_s"]["median"] for r in runs])) * 1e3,
            "bare_ms": float(np.median([r["bare_step_s"]["median"] for r in runs])) * 1e3,
            "same_init": all(r["same_init"] for r in runs),
            "max_loss_rel_diff": max(r["max_loss_rel_diff"] for r in runs), "processes": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--rounds", type=int, help="windows per side and process (default: per case)")
    parser.add_argument("--processes", type=int, default=5, help="fresh processes per case (median)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one case, in this process: prints JSON
    args = parser.parse_args()
    if args.child:
        return print(json.dumps(measure(args.child, args.rounds or CASES[args.child][2])))
    rounds = ["--rounds", str(args.rounds)] if args.rounds else []
    results = {name: summarize([child(__file__, "--child", name, *rounds) for _ in range(args.processes)])
               for name in args.cases}
    rows = [(name, f"{r['batch_size']}x{r['seq_len']}", r["theseus_ms"], r["bare_ms"], r["ratio"], r["paired_ratio"],
             " ".join(f"{p['paired_ratio']:.3f}" for p in r["processes"]), r["program_ratio"]["bytes_accessed"],
             r["program_ratio"]["temp_bytes"], r["max_loss_rel_diff"], r["same_init"]) for name, r in results.items()]
    show("overhead: theseus loop vs bare JAX + optax loop (step time, interleaved; median over processes)",
         ["case", "batch x seq", "theseus ms", "bare ms", "ratio", "paired ratio", "paired, each process",
          "XLA bytes ratio", "XLA temp ratio", "loss rel diff", "same init"],
         rows, note="target: ratio <= 1.02; XLA ratios: the compiled steps' bytes accessed and scratch memory")
    save("overhead", results)


if __name__ == "__main__":
    main()
