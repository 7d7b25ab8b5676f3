"""``python -m theseus.evaluate RUN --tasks ... --include DIR`` and ``evaluation.lm_eval`` at the
trainer's evaluations, as a user runs them, give lm-eval's own numbers for the run's exported
model; the run's in-training multiple-choice accuracies equal lm-eval's on contexts that end in
whitespace or mid-word."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support import ROOT, run_python
from evaluation.harness_fixtures import write_tasks

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")

STEPS = 20
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Path]:
    """A gpt_tiny byte-level run that scores the local tasks at its last evaluation, and its export."""
    base = tmp_path_factory.mktemp("harness")
    tasks = write_tasks(base / "tasks")
    corpus = base / "corpus.txt"
    corpus.write_text((ROOT / "theseus" / "evaluation" / "evaluations.py").read_text() * 8)
    proc = run_python("-m", "theseus.run", "+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}",
                      f"data.cache_dir={base / 'cache'}", f"trainer.max_steps={STEPS}",
                      f"trainer.checkpoint_every={STEPS}", f"trainer.eval_every={STEPS}", "trainer.eval_batches=1",
                      "logger.mode=disabled", f"evaluation.multiple_choice.mc={tasks / 'mc.jsonl'}",
                      "evaluation.lm_eval=[theseus_ppl]", f"evaluation.lm_eval_include={tasks}",
                      f"hydra.run.dir={base / 'run'}", cwd=base, env=OFFLINE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_python("-m", "theseus.export", str(base / "run"), str(base / "hf"), cwd=base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"base": base, "run": base / "run", "hf": base / "hf", "tasks": tasks}


@pytest.fixture(scope="module")
def expected(run) -> dict:
    """lm-eval's own hf model on the exported folder, run as lm-eval's command with
    ``--output_path`` (``lm_eval_out/hf.json``): the files it writes (``files``), its results as
    it writes them, and each task's samples (``samples``: TASK -> records)."""
    out = run["base"] / "lm_eval_out" / "hf.json"
    proc = run_python("-m", "lm_eval", "--model", "hf", "--model_args",
                      f"pretrained={run['hf']},dtype=float32", "--device", "cpu", "--tasks", "theseus_mc,theseus_ppl",
                      "--include_path", str(run["tasks"]), "--batch_size", "4", "--log_samples",
                      "--output_path", str(out), cwd=run["base"], env=OFFLINE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return written(out)


def written(out: Path) -> dict:
    """What ``--output_path out`` (a .json path) left beside it, but theseus's own ``out`` and its
    samples: lm-eval's results file (``STEM_DATE.json``) and each task's ``samples_TASK_DATE.jsonl``
    (their names with the date as ``DATE``)."""
    files = sorted(path.name for path in out.parent.iterdir() if path.name not in (out.name, f"{out.stem}.jsonl"))
    [results] = out.parent.glob(f"{out.stem}_*.json")
    date = results.name[len(out.stem) + 1:-len(".json")]
    return {**json.loads(results.read_text()), "files": [name.replace(date, "DATE") for name in files],
            "date_id": date, "samples": {task: [json.loads(line) for line in path.read_text().splitlines()]
                                         for task in ("theseus_mc", "theseus_ppl")
                                         for path in out.parent.glob(f"samples_{task}_{date}.jsonl")}}


def metric(expected: dict, task: str, name: str) -> float:
    return expected["results"][task][f"{name},none"]


@pytest.mark.slow
def test_the_trainers_evaluation_equals_lm_eval_on_the_export(run, expected):
    logged = [json.loads(line) for line in (run["run"] / "metrics.jsonl").read_text().splitlines()]
    final = [row for row in logged if "val_loss" in row][-1]
    assert final["step"] == STEPS
    for name in ("acc", "acc_norm", "acc_bytes"):  # theseus's own scorer, in training
        assert final[f"eval/mc/{name}"] == metric(expected, "theseus_mc", name)
        assert final[f"eval/mc/{name}_stderr"] == pytest.approx(metric(expected, "theseus_mc", f"{name}_stderr"))
    for name in ("word_perplexity", "byte_perplexity", "bits_per_byte"):  # lm-eval's task, in training
        assert final[f"eval/theseus_ppl/{name}"] == pytest.approx(metric(expected, "theseus_ppl", name), rel=1e-5)


@pytest.mark.slow
def test_evaluate_with_tasks_equals_lm_eval_on_the_export(run, expected):
    """On 4 devices: the run's mesh over all of them splits each batch of requests. Outside a git
    repository, with task YAMLs that leave their metrics' aggregation to lm-eval's defaults (the
    README's): none of lm-eval's warnings about those defaults, no ``fatal: not a git repository``."""
    out = run["base"] / "evaluated" / "lm_eval.json"
    proc = run_python("-m", "theseus.evaluate", str(run["run"]), "--tasks", "theseus_mc,theseus_ppl",
                      "--include", str(run["tasks"]), "--output_path", str(out), cwd=run["base"], env=OFFLINE,
                      devices=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "is defined, but" not in proc.stderr and "not a git repository" not in proc.stderr, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["mesh"]["data"] == 4
    metrics = record["metrics"]
    for name in ("acc", "acc_norm", "acc_bytes"):
        assert metrics[f"eval/theseus_mc/{name}"] == metric(expected, "theseus_mc", name)
        assert metrics[f"eval/mc/{name}"] == metric(expected, "theseus_mc", name)
    assert metrics["eval/theseus_ppl/bits_per_byte"] == pytest.approx(metric(expected, "theseus_ppl", "bits_per_byte"),
                                                                      rel=1e-5)
    samples = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    ours = [s for s in samples if s["task"] == "theseus_mc"]
    assert len(ours) == len(expected["samples"]["theseus_mc"])
    for a, b in zip(ours, expected["samples"]["theseus_mc"]):  # each choice's log-likelihood
        assert [r[0] for r in a["responses"]] == pytest.approx([float(r[0]) for r in b["filtered_resps"]], abs=1e-4)

    # lm-eval's own files too, as lm_eval --output_path writes them: names, fields, numbers, samples
    assert proc.stdout.splitlines()[-1] == f"lm-eval's results: {out.parent}/lm_eval_{written(out)['date_id']}.json"
    theirs, ours = expected, written(out)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d+", ours["date_id"])
    assert ours["files"] == [name.replace("hf_", "lm_eval_") for name in theirs["files"]] == [
        "lm_eval_DATE.json", "samples_theseus_mc_DATE.jsonl", "samples_theseus_ppl_DATE.jsonl"]
    assert set(ours) == set(theirs)
    assert ours["model_source"] == "theseus" and ours["model_name"] == str(run["run"])
    for key in ("versions", "n-shot", "higher_is_better", "n-samples", "group_subtasks"):
        assert ours[key] == theirs[key], key
    for task, config in theirs["configs"].items():  # the task configs, but the model's arguments lm-eval's command adds
        metadata = {key: value for key, value in config.pop("metadata").items() if key not in ("pretrained", "dtype")}
        assert ours["configs"][task] == {**config, "metadata": metadata}, task
    for task in ("theseus_mc", "theseus_ppl"):
        assert set(ours["results"][task]) == set(theirs["results"][task])
        for key, value in theirs["results"][task].items():  # the numbers; alias, N/A stderrs as they are
            assert ours["results"][task][key] == (pytest.approx(value, rel=1e-5) if isinstance(value, float) else value)
        assert [set(record) for record in ours["samples"][task]] == [set(record) for record in theirs["samples"][task]]
        assert [r["doc_hash"] for r in ours["samples"][task]] == [r["doc_hash"] for r in theirs["samples"][task]]
    assert ours["task_hashes"] == theirs["task_hashes"]  # the same documents, prompts and targets
    for key in ("tokenizer_pad_token", "tokenizer_eos_token", "tokenizer_bos_token", "eot_token_id", "max_length"):
        assert ours[key] == theirs[key], key  # the run's tokenizer as the export's


@pytest.mark.slow
def test_an_output_path_folder_is_laid_out_as_lm_eval_lays_it_out(run):
    """``--output_path FOLDER`` (no ``.json``): theseus's ``FOLDER/eval-STEP.json``, and lm-eval's
    files in ``FOLDER/MODEL`` (the model's name as lm-eval sanitizes it), the same numbers."""
    from lm_eval.utils import sanitize_model_name

    out = run["base"] / "evaluated_folder"
    proc = run_python("-m", "theseus.evaluate", str(run["run"]), "--tasks", "theseus_mc", "--include",
                      str(run["tasks"]), "--limit", "4", "--output_path", str(out), cwd=run["base"], env=OFFLINE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / f"eval-{STEPS}.json").read_text())
    folder = out / sanitize_model_name(str(run["run"]))
    [results] = folder.glob("results_*.json")
    date = results.name.removeprefix("results_").removesuffix(".json")
    assert sorted(path.name for path in folder.iterdir()) == [results.name, f"samples_theseus_mc_{date}.jsonl"]
    assert proc.stdout.splitlines()[-1] == f"lm-eval's results: {results}"
    theirs = json.loads(results.read_text())["results"]["theseus_mc"]
    assert theirs["acc,none"] == record["metrics"]["eval/theseus_mc/acc"]
    assert theirs["sample_len"] == 4


@pytest.mark.slow
def test_an_unknown_task_or_a_missing_include_is_one_line(run):
    proc = run_python("-m", "theseus.evaluate", str(run["run"]), "--tasks", "no_such_task", "--include",
                      str(run["tasks"]), cwd=run["base"], env=OFFLINE)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"theseus: error: unknown lm-eval task 'no_such_task': give the name of one of lm-eval's tasks or of a "
        f"task YAML under {run['tasks']}")
    proc = run_python("-m", "theseus.evaluate", str(run["run"]), "--tasks", "theseus_mc", "--include",
                      str(run["base"] / "nowhere"), cwd=run["base"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"theseus: error: evaluation.lm_eval_include={run['base']}/nowhere: no such file or folder; give a folder "
        "of lm-eval task YAMLs")


WITHOUT_LM_EVAL = """
import sys
sys.modules["lm_eval"] = None  # as if lm-eval were not installed
from theseus.cli.evaluate import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_without_lm_eval_one_line_says_what_to_install(run):
    proc = run_python("-c", WITHOUT_LM_EVAL, str(run["run"]), "--tasks", "theseus_mc", cwd=run["base"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "theseus: error: lm-evaluation-harness is not installed: pip install 'theseus[eval]' (or lm-eval)")
