"""``python -m theseus.evaluate RUN_DIR [--step N] [--out FILE] [evaluation.* overrides]``: evaluate a checkpoint.

Runs the evaluations a training run logs (``val_loss``, per mixture source, each task of
``evaluation.multiple_choice``) on a run directory's newest readable checkpoint (or
``--step``), on one device, prints them as a table and writes them as JSON to
``RUN_DIR/eval-STEP.json`` (or ``--out``). Overrides may add or change evaluation keys::

    python -m theseus.evaluate outputs/run evaluation.multiple_choice.toy=toy.jsonl trainer.eval_batches=20
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import jax
from jax.sharding import NamedSharding, PartitionSpec
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from theseus.config import ConfigError, configuration, configure
from theseus.data.config import DataConfig
from theseus.sample import restore
from theseus.tasks.evaluation import evaluate, load_evaluations
from theseus.tasks.task import task_class
from theseus.training.config import TrainerConfig
from theseus.training.step import eval_step
from theseus.training.trainer import BATCH_MESH_AXES

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


def run_evaluations(run_dir: Path, step: int | None, args: list[str]) -> tuple[int, dict[str, float]]:
    """``(step, metrics)`` of the run's checkpoint, evaluated as the trainer evaluates."""
    run = restore(run_dir, step, overrides(args))
    with configuration(run.cfg):
        settings, data, task = configure(TrainerConfig), configure(DataConfig), configure(task_class(run.cfg))
    evaluations = load_evaluations(run.cfg, run.data, run.model, data.seed, prefetch=0)
    loss = jax.jit(functools.partial(eval_step, model=run.model, task=task))
    metrics = evaluate(run.params, evaluations, loss=loss, val_metrics=task.val_metrics,
                       sharding=NamedSharding(run.mesh, PartitionSpec(BATCH_MESH_AXES, None)), rules=(), share=(0, 1),
                       batch_size=settings.batch_size // settings.grad_accum, batches=settings.eval_batches)
    return run.step, metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m theseus.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write (default: RUN_DIR/eval-STEP.json)")
    parser.add_argument("overrides", nargs="*", help="evaluation.*=VALUE, trainer.eval_batches=N")
    args = parser.parse_intermixed_args(argv)
    try:
        step, metrics = run_evaluations(args.run_dir, args.step, args.overrides)
    except ConfigError as exc:
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    table = Table(title=f"{args.run_dir} at step {step}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        table.add_row(key, f"{value:.4f}")
    Console().print(table)
    out = args.out or args.run_dir / f"eval-{step}.json"
    out.write_text(json.dumps({"run_dir": str(args.run_dir), "step": step, "metrics": metrics}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
