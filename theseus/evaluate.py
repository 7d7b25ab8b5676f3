"""``python -m theseus.evaluate PATH [--step N] [--out FILE] [KEY=VALUE ...]``: evaluate a trained model.

Runs the evaluations a training run logs (``val_loss``, per mixture source, each task of
``evaluation.multiple_choice``) as the trainer runs them (the config's mesh over every device),
prints them as a table and writes them as JSON to ``PATH/eval-STEP.json`` (or ``--out``). PATH
is a run directory (its newest readable checkpoint, or ``--step``; overrides may add or change
evaluation keys) or a Hugging Face folder (its weights; overrides also name the data)::

    python -m theseus.evaluate outputs/run evaluation.multiple_choice.toy=toy.jsonl trainer.eval_batches=20
    python -m theseus.evaluate ~/models/my-llama data.source=text data.path=notes.txt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from theseus.config import ConfigError
from theseus.training.trained import is_run_dir, source_config, trained_params
from theseus.training.trainer import Trainer

# What an override may set (key prefixes, and how the refusal says it): what is evaluated, not
# the model; a Hugging Face folder brings no data, so its overrides name that too.
RUN_KEYS = (("evaluation.", "trainer.eval_batches"),
            "e.g. evaluation.multiple_choice.NAME=FILE or trainer.eval_batches=N (the model and data are the run's)")
FOLDER_KEYS = ((*RUN_KEYS[0], "data.", "trainer.batch_size"),
               "e.g. data.path=FILE, evaluation.multiple_choice.NAME=FILE or trainer.eval_batches=N "
               "(the model is the folder's)")


def overrides(args: list[str], allowed: tuple[tuple[str, ...], str]) -> list[str]:
    """``KEY=VALUE`` arguments (a leading ``+`` dropped) whose keys start with one of the
    ``allowed`` prefixes; ConfigError for any other."""
    prefixes, hint = allowed
    items = []
    for arg in args:
        key, sep, value = arg.lstrip("+").partition("=")
        if not sep or not key.startswith(prefixes):
            raise ConfigError(f"{arg!r}: give evaluation keys as KEY=VALUE, {hint}")
        items.append(f"{key}={value}")
    return items


def run_evaluations(path: Path, step: int | None, args: list[str]) -> dict:
    """The record of an evaluation of a run's checkpoint or a Hugging Face folder's weights
    (``step``: None for a folder; ``mesh``, ``metrics``), by the Trainer: its mesh over every
    device, its parameter layout and compiled eval step, the batches its loop evaluates on."""
    trainer = Trainer(source_config(path, overrides(args, RUN_KEYS if is_run_dir(path) else FOLDER_KEYS)))
    compiled = trainer.build(train=False)
    params, at = trained_params(path, step, trainer.model, compiled.target)
    return {"path": str(path), "step": at, "mesh": dict(compiled.mesh.shape),
            "metrics": trainer.evaluation_metrics(compiled, params)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m theseus.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="a run directory or a Hugging Face folder")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step of a run (default: the newest)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON file to write (default: PATH/eval-STEP.json, PATH/eval.json for a folder)")
    parser.add_argument("overrides", nargs="*", help="evaluation.*=VALUE, trainer.eval_batches=N; for a folder data.*")
    args = parser.parse_intermixed_args(argv)
    try:
        record = run_evaluations(args.path, args.step, args.overrides)
    except ConfigError as exc:
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    mesh = " x ".join(f"{axis} {size}" for axis, size in record["mesh"].items())
    at = "" if record["step"] is None else f" at step {record['step']}"
    table = Table(title=f"{args.path}{at} (mesh {mesh})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in record["metrics"].items():
        table.add_row(key, f"{value:.4f}")
    Console().print(table)
    out = args.out or args.path / ("eval.json" if record["step"] is None else f"eval-{record['step']}.json")
    out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
