"""``python -m theseus.evaluate PATH [--step N] [--out FILE] [KEY=VALUE ...]``: evaluate a trained model.

Runs the evaluations a training run logs (``val_loss``, per mixture source, each task of
``evaluation.multiple_choice``) as the trainer runs them (the config's mesh over every device),
prints them as a table and writes them as JSON to ``PATH/eval-STEP.json`` (or ``--out FILE.json``,
or into ``--out FOLDER``), with each task's per-example scores beside it in ``eval-STEP.jsonl``.
PATH is a run directory (its newest readable checkpoint, or ``--step``; overrides may add or
change evaluation keys) or a Hugging Face folder (its weights; overrides also name the data)::

    python -m theseus.evaluate outputs/run evaluation.multiple_choice.toy=toy.jsonl trainer.eval_batches=20
    python -m theseus.evaluate ~/models/my-llama data.source=text data.path=notes.txt

``--tasks hellaswag,arc_easy`` adds lm-evaluation-harness tasks (lm-eval's names, or those of
the task YAMLs under ``--include PATH``; ``--num_fewshot``, ``--limit`` as lm-eval has them):
``evaluation.lm_eval`` and its keys, which the trainer's evaluations take too. Needs ``theseus[eval]``.
With ``--output_path`` (``--out``) their results are also written as ``lm_eval --output_path`` writes
them (``STEM_DATE.json`` beside a ``.json`` path, else ``FOLDER/MODEL/results_DATE.json``; each
task's ``samples_TASK_DATE.jsonl``), for lm-eval's tools.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from theseus.config import ConfigError, registry
from theseus.config.arguments import NON_NEGATIVE_INT, POSITIVE_INT, Parser
from theseus.config.compose import undeclared, unknown_key
from theseus.recipe import assemble
from theseus.training.checkpoint import require_checkpoint
from theseus.trained import is_run_dir, source_config, trained_params

# What an override may set (key prefixes, and how the refusal says it): what is evaluated, not
# the model; a Hugging Face folder brings no data, so its overrides name that too.
RUN_KEYS = (("evaluation.", "trainer.eval_batches"),
            "e.g. evaluation.multiple_choice.NAME=FILE or trainer.eval_batches=N (the model and data are the run's)")
FOLDER_KEYS = ((*RUN_KEYS[0], "data.", "trainer.batch_size", "task"),
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
    registry.load()
    keys = [item for item in items if item.partition("=")[0] not in registry.groups()]  # task=sft: a choice
    for key, where in undeclared(keys):  # a misspelt key: refused, as theseus.run refuses it
        raise unknown_key(key, where)
    return items


def run_evaluations(path: Path, step: int | None, args: list[str]) -> dict:
    """The record of an evaluation of a run's checkpoint or a Hugging Face folder's weights
    (``step``: None for a folder; ``mesh``, ``metrics``, ``samples``), assembled as a run is:
    its mesh over every device, its parameter layout and compiled eval step, the batches its
    loop evaluates on; ``lm_eval``: lm-eval's own results of ``evaluation.lm_eval``'s tasks (or None)."""
    require_checkpoint(path)
    run = assemble(source_config(path, overrides(args, RUN_KEYS if is_run_dir(path) else FOLDER_KEYS)), steps="eval")
    params, at = trained_params(path, step, run.model, run.compiled.target, run.base)
    metrics = run.evaluate(params)
    samples = [{"task": task, "index": i, **record}
               for task, records in run.evaluations.samples.items() for i, record in enumerate(records)]
    return {"path": str(path), "step": at, "mesh": dict(run.compiled.mesh.shape), "metrics": metrics,
            "samples": samples, "lm_eval": run.evaluations.harness_results or None}


def lm_eval_overrides(tasks: str | None, include: str | None, fewshot: int | None, limit: int | None) -> list[str]:
    """The command line's lm-eval options as the ``evaluation.lm_eval*`` keys they stand for."""
    if tasks is None:
        return []
    options = {"lm_eval_include": include, "lm_eval_fewshot": fewshot, "lm_eval_limit": limit}
    return [f"evaluation.lm_eval=[{','.join(task for task in tasks.split(',') if task)}]",
            *(f"evaluation.{key}={'null' if value is None else value}" for key, value in options.items())]


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m theseus.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="a run directory or a Hugging Face folder")
    parser.add_argument("--step", type=NON_NEGATIVE_INT, default=None, help="checkpoint step of a run (default: the newest)")
    parser.add_argument("--out", "--output_path", type=Path, default=None,
                        help="JSON file to write (default: PATH/eval-STEP.json, PATH/eval.json for a folder), or a "
                             "folder to write it in (a path not ending in .json, as lm-eval takes it); per-example "
                             "scores go beside it, and with --tasks lm-eval's own results files as lm_eval "
                             "--output_path writes them")
    parser.add_argument("--tasks", default=None, help="lm-eval task names, comma-separated (needs theseus[eval])")
    parser.add_argument("--include", "--include_path", default=None, help="a folder of local lm-eval task YAMLs")
    parser.add_argument("--num_fewshot", type=NON_NEGATIVE_INT, default=None, help="few-shot examples (default: each task's own)")
    parser.add_argument("--limit", type=POSITIVE_INT, default=None, help="at most this many examples of each lm-eval task")
    parser.add_argument("overrides", nargs="*", help="evaluation.*=VALUE, trainer.eval_batches=N; for a folder data.*")
    args = parser.parse_intermixed_args(argv)
    try:
        if args.out is not None and args.out.suffix != ".json" and args.out.is_file():
            raise ConfigError(f"--output_path {args.out} is a file: give a folder, or a .json file to write")
        lm_eval = lm_eval_overrides(args.tasks, args.include, args.num_fewshot, args.limit)
        record = run_evaluations(args.path, args.step, [*args.overrides, *lm_eval])
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
    name = "eval.json" if record["step"] is None else f"eval-{record['step']}.json"
    out = args.path / name if args.out is None else args.out if args.out.suffix == ".json" else args.out / name
    out.parent.mkdir(parents=True, exist_ok=True)
    samples, harness_results = record.pop("samples"), record.pop("lm_eval")
    out.write_text(json.dumps(record, indent=2) + "\n")
    if samples:
        out.with_suffix(".jsonl").write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    if harness_results is not None and args.out is not None:  # lm-eval writes only where it is told to
        from theseus.tasks import harness

        print(f"lm-eval's results: {harness.write_results(harness_results, args.out, str(args.path))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
