"""``python -m theseus.evaluate RUN_DIR [--step N] [--out FILE] [evaluation.* overrides]``: evaluate a checkpoint.

Runs the evaluations a training run logs (``val_loss``, per mixture source, each task of
``evaluation.multiple_choice``) on a run directory's newest readable checkpoint (or
``--step``) as the trainer runs them (the run's mesh over every device), prints them as a
table and writes them as JSON to ``RUN_DIR/eval-STEP.json`` (or ``--out``), with each task's
per-example scores beside it in ``eval-STEP.jsonl``. Overrides may add or change evaluation keys::

    python -m theseus.evaluate outputs/run evaluation.multiple_choice.toy=toy.jsonl trainer.eval_batches=20

``--tasks hellaswag,arc_easy`` adds lm-evaluation-harness tasks (lm-eval's names, or those of
the task YAMLs under ``--include PATH``; ``--num_fewshot``, ``--limit`` as lm-eval has them):
``evaluation.lm_eval`` and its keys, which the trainer's evaluations take too. Needs ``theseus[eval]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from theseus.config import ConfigError
from theseus.sample import checkpoint, saved_config
from theseus.training.trainer import Trainer

KEYS = ("evaluation.", "trainer.eval_batches")  # what an override may set: what is evaluated, not the model


def overrides(args: list[str]) -> DictConfig:
    """``KEY=VALUE`` arguments (a leading ``+`` allowed) as a config; ConfigError for any other key."""
    items = []
    for arg in args:
        key, sep, value = arg.lstrip("+").partition("=")
        if not sep or not key.startswith(KEYS):
            raise ConfigError(f"{arg!r}: give evaluation keys as KEY=VALUE, e.g. evaluation.multiple_choice.NAME=FILE "
                              f"or trainer.eval_batches=N (the model and data are the run's)")
        items.append(f"{key}={value}")
    return OmegaConf.from_dotlist(items)


def run_evaluations(run_dir: Path, step: int | None, args: list[str], lm_eval: dict | None = None) -> dict:
    """The record of an evaluation of the run's checkpoint (``step``, ``mesh``, ``metrics``,
    ``samples``), by the run's own Trainer: its mesh over every device, its parameter layout and
    compiled eval step, the batches its loop evaluates on. ``lm_eval``: ``evaluation.*`` keys to set."""
    trainer = Trainer(saved_config(run_dir, OmegaConf.merge(overrides(args), {"evaluation": lm_eval or {}})))
    compiled = trainer.build(train=False)
    state, at = checkpoint(run_dir, step, compiled.target)
    metrics = trainer.evaluation_metrics(compiled, state.params)
    samples = [{"task": task, "index": i, **record}
               for task, records in trainer.evaluations.samples.items() for i, record in enumerate(records)]
    return {"run_dir": str(run_dir), "step": at, "mesh": dict(compiled.mesh.shape), "metrics": metrics,
            "samples": samples}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m theseus.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    parser.add_argument("--out", "--output_path", type=Path, default=None,
                        help="JSON file to write (default: RUN_DIR/eval-STEP.json); per-example scores go beside it")
    parser.add_argument("--tasks", default=None, help="lm-eval task names, comma-separated (needs theseus[eval])")
    parser.add_argument("--include", "--include_path", default=None, help="a folder of local lm-eval task YAMLs")
    parser.add_argument("--num_fewshot", type=int, default=None, help="few-shot examples (default: each task's own)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many examples of each lm-eval task")
    parser.add_argument("overrides", nargs="*", help="evaluation.*=VALUE, trainer.eval_batches=N")
    args = parser.parse_intermixed_args(argv)
    try:
        lm_eval = {} if args.tasks is None else {
            "lm_eval": [task for task in args.tasks.split(",") if task], "lm_eval_include": args.include,
            "lm_eval_fewshot": args.num_fewshot, "lm_eval_limit": args.limit}
        record = run_evaluations(args.run_dir, args.step, args.overrides, lm_eval)
    except ConfigError as exc:
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    mesh = " x ".join(f"{axis} {size}" for axis, size in record["mesh"].items())
    table = Table(title=f"{args.run_dir} at step {record['step']} (mesh {mesh})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in record["metrics"].items():
        table.add_row(key, f"{value:.4f}")
    Console().print(table)
    out = args.out or args.run_dir / f"eval-{record['step']}.json"
    samples = record.pop("samples")
    out.write_text(json.dumps(record, indent=2) + "\n")
    if samples:
        out.with_suffix(".jsonl").write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
