"""``python -m theseus.evaluate PATH [--step N] [--out FILE] [KEY=VALUE ...]``: evaluate a trained model.

Runs the evaluations a training run logs (``val_loss``, per mixture source, each task of
``evaluation.multiple_choice``) as the trainer runs them (the config's mesh over every device),
prints them as a table and writes them as JSON: a run's into ``RUN/eval-STEP.json`` (or ``--out
FILE.json``, or into ``--out FOLDER``), with each task's per-example scores beside it in
``eval-STEP.jsonl``; another model's only where ``--out`` says (nothing is written into a model's
folder). PATH is a model source: a theseus run (its newest readable checkpoint, or ``--step``;
overrides may add or change evaluation keys, or name other data and the task to score it by),
a Hugging Face folder, a GGUF file or a model id in the local Hugging Face cache (its weights;
overrides also name the data, and the window ``architecture.seq_len``: by default the model's
context up to 1024 tokens, shorter where the data holds less)::

    python -m theseus.evaluate outputs/run evaluation.multiple_choice.toy=toy.jsonl trainer.eval_batches=20
    python -m theseus.evaluate ~/models/my-llama data.source=text data.path=notes.txt
    python -m theseus.evaluate ~/models/my-llama task=dpo data.source=jsonl data.path=pairs.jsonl dpo.reference=REF
    python -m theseus.evaluate outputs/sft task=dpo data.source=jsonl data.path=pairs.jsonl dpo.reference=REF

A run's own data (no ``data.*`` key given) is scored on its validation split, what its
evaluations scored; data named on the command line by the task's ``LossTask.EVALUATE_SPLIT``:
``task=dpo`` scores every pair of the file, ``val_loss`` and TRL's ``val_rewards/...``,
``val_logps/...`` (``dpo.*`` overrides give another reference, loss or beta, for a run too).
The first line says which.

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

from omegaconf import DictConfig

from theseus.base.compilation_cache import use_compilation_cache
from theseus.base.compile_oom import oom_verdict
from theseus.config import ConfigError, configured, registry
from theseus.config.arguments import NON_NEGATIVE_INT, POSITIVE_INT, Parser
from theseus.config.compose import undeclared, unknown_key
from theseus.data.config import DataConfig
from theseus.interop.hf_config import arch_of
from theseus.recipe import assemble, resolve
from theseus.sources.model_source import ModelSource
from theseus.sources.parse import parse_source
from theseus.training.settings import Context, configure_settings

WINDOW = "architecture.seq_len"
# What an override may set (key prefixes, and how the refusal says it): what is evaluated, not
# the model: its window and batch are a run's own; a Hugging Face folder brings no data, a run
# may be scored on other data (an SFT run on preference pairs: task=dpo data.path=PAIRS).
RUN_KEYS = (("evaluation.", "trainer.eval_batches", "dpo.", "data.", "task"),
            "e.g. evaluation.multiple_choice.NAME=FILE, trainer.eval_batches=N, dpo.reference=MODEL or task=dpo "
            "data.source=jsonl data.path=FILE (the model is the run's)")
FOLDER_KEYS = ((*RUN_KEYS[0], "trainer.batch_size", WINDOW),
               "e.g. data.path=FILE, architecture.seq_len=N, evaluation.multiple_choice.NAME=FILE or "
               "trainer.eval_batches=N (the model is the folder's)")
FITTED = ("char", "bpe")  # data.tokenizer values fitted to a run's own data
EVAL_WINDOW = 1024  # a model's default window here, at most: a long context (8192) is rarely what data needs


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


def run_evaluations(source: ModelSource, step: int | None, args: list[str]) -> dict:
    """The record of an evaluation of a run's checkpoint or another model source's weights
    (``step``: None for those; ``mesh``, ``metrics``, ``samples``), assembled as a run is: its
    mesh over every device, its parameter layout and compiled eval step, the batches its loop
    evaluates on; ``lm_eval``: lm-eval's own results of ``evaluation.lm_eval``'s tasks (or None)."""
    given = overrides(args, FOLDER_KEYS if source.imported else RUN_KEYS)
    cfg = source.config(given)
    own = not source.imported and not any(item.startswith("data.") for item in given)  # the run's own data
    if not source.imported and not own:
        check_other_data(source, given, configure_settings(cfg).data)
    if source.imported and not any(item.startswith(f"{WINDOW}=") for item in given):
        cfg = source.config([*given, f"{WINDOW}={window(cfg)}"])
    run = assemble(resolve(cfg), steps="eval")
    params, at = source.trained_params(step, arch_of(run.model), run.compiled.target, run.base)
    split = "val" if own else run.task.EVALUATE_SPLIT
    with oom_verdict(f"the evaluation (windows of {run.model.seq_len} tokens, {run.micro_batch} a batch)",
                     advice="lower trainer.batch_size or architecture.seq_len"):
        metrics = run.evaluate(params, split=split)
    samples = [{"task": task, "index": i, **record}
               for task, records in run.evaluations.samples.items() for i, record in enumerate(records)]
    return {"path": str(source.given), "step": at, "mesh": dict(run.compiled.mesh.shape),
            "seq_len": run.model.seq_len, "split": split, "scored": scored(run.settings.data, split, own),
            "metrics": metrics, "samples": samples, "lm_eval": run.evaluations.harness_results or None}


def check_other_data(source: ModelSource, given: list[str], data: DataConfig) -> None:
    """ConfigError unless a run can be scored on the data ``given`` names (``data``: the run's
    settings with them): read by the run's own tokenizer, its model's vocabulary, which a
    ``data.tokenizer`` given would replace and a char or bpe one was fitted to the run's data."""
    tokenizer = next((item for item in given if item.startswith("data.tokenizer=")), None)
    if tokenizer is not None:
        raise ConfigError(f"{tokenizer!r}: {source.given} reads its data with its own tokenizer, its model's "
                          "vocabulary: drop data.tokenizer")
    if data.tokenizer in FITTED:
        key = next(item for item in given if item.startswith("data."))
        raise ConfigError(f"{key!r}: {source.given}'s tokenizer (data.tokenizer={data.tokenizer}) was fitted to its "
                          "own data and reads no other: evaluate the run on its own data (no data.* keys)")


def scored(data: DataConfig, split: str, own: bool) -> str:
    """What an evaluation scored, in words: a run's own validation split, or the data named."""
    if own:
        return "the run's validation split"
    where = f"data.path={data.path}" if data.path else f"data.source={data.source}"
    return f"{'every example' if split == 'all' else 'the validation split'} of {where}"


def window(cfg: DictConfig) -> int:
    """The window a model source is evaluated in: its context, at most EVAL_WINDOW tokens, and
    no longer than the data's splits allow (``LossTask.longest_window``)."""
    spec = resolve(cfg)
    context = configured(Context, spec.values).seq_len
    return max(1, min(context, EVAL_WINDOW, spec.task.longest_window(spec.task.dataset(spec.settings.data))))


def lm_eval_overrides(tasks: str | None, include: str | None, fewshot: int | None, limit: int | None) -> list[str]:
    """The command line's lm-eval options as the ``evaluation.lm_eval*`` keys they stand for."""
    if tasks is None:
        return []
    options = {"lm_eval_include": include, "lm_eval_fewshot": fewshot, "lm_eval_limit": limit}
    return [f"evaluation.lm_eval=[{','.join(task for task in tasks.split(',') if task)}]",
            *(f"evaluation.{key}={'null' if value is None else value}" for key, value in options.items())]


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m theseus.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a theseus run or checkpoint, a Hugging Face folder, a .gguf file or a model id "
                                     "in the local Hugging Face cache")
    parser.add_argument("--step", type=NON_NEGATIVE_INT, default=None, help="checkpoint step of a run (default: the newest)")
    parser.add_argument("--out", "--output_path", type=Path, default=None,
                        help="JSON file to write (default: a run's RUN/eval-STEP.json; another model's: none), or a "
                             "folder to write it in (a path not ending in .json, as lm-eval takes it); per-example "
                             "scores go beside it, and with --tasks lm-eval's own results files as lm_eval "
                             "--output_path writes them")
    parser.add_argument("--tasks", default=None, help="lm-eval task names, comma-separated (needs theseus[eval])")
    parser.add_argument("--include", "--include_path", default=None, help="a folder of local lm-eval task YAMLs")
    parser.add_argument("--num_fewshot", type=NON_NEGATIVE_INT, default=None, help="few-shot examples (default: each task's own)")
    parser.add_argument("--limit", type=POSITIVE_INT, default=None, help="at most this many examples of each lm-eval task")
    parser.add_argument("overrides", nargs="*", help="evaluation.*=VALUE, trainer.eval_batches=N, dpo.*=VALUE; "
                                                      "task=NAME, data.*=VALUE: the data to score (a run without "
                                                      "them: its own validation split); for a model, not a run, "
                                                      "also architecture.seq_len=N, trainer.batch_size=N")
    args = parser.parse_intermixed_args(argv)
    use_compilation_cache()
    try:
        if args.out is not None and args.out.suffix != ".json" and args.out.is_file():
            raise ConfigError(f"--output_path {args.out} is a file: give a folder, or a .json file to write")
        lm_eval = lm_eval_overrides(args.tasks, args.include, args.num_fewshot, args.limit)
        source = parse_source(args.path, key=None)
        record = run_evaluations(source, args.step, [*args.overrides, *lm_eval])
    except ConfigError as exc:
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    mesh = " x ".join(f"{axis} {size}" for axis, size in record["mesh"].items())
    at = "" if record["step"] is None else f" at step {record['step']}"
    print(f"{args.path}{at}: mesh {mesh}, windows of {record['seq_len']} tokens; scored {record['scored']}")
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in record["metrics"].items():
        table.add_row(key, f"{value:.4f}")
    Console().print(table)
    samples, harness_results = record.pop("samples"), record.pop("lm_eval")
    name = "eval.json" if record["step"] is None else f"eval-{record['step']}.json"
    if args.out is None and record["step"] is None:  # a model's folder is not ours to write into
        print("(--out FILE.json writes these numbers)")
        return 0
    out = source.run_dir / name if args.out is None else args.out if args.out.suffix == ".json" else args.out / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    if samples:
        out.with_suffix(".jsonl").write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    print(f"wrote {out}" + (f" (each example's scores: {out.with_suffix('.jsonl')})" if samples else ""))
    if harness_results is not None and args.out is not None:  # lm-eval writes only where it is told to
        from theseus.evaluation import harness

        print(f"lm-eval's results: {harness.write_results(harness_results, args.out, str(args.path))}")
    return 0
