"""Evaluations as a user meets them: a mixture run (resumed bit for bit) logs each source's loss and
each task's accuracy; ``python -m theseus.evaluate`` gives the same numbers from a checkpoint."""

from __future__ import annotations

import json
import math
import random
import string
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from support import ROOT, read_params, run_python
from theseus.cli.trained import load_trained
from theseus.config import ConfigError, configuration, configure
from theseus.config.compose import compose
from theseus.data.config import DataConfig
from theseus.data.dataset import open_dataset
from theseus.evaluation.evaluations import EvaluationConfig, evaluate, load_evaluations
from theseus.recipe import assemble, resolve

STEPS = 12
LETTERS = string.ascii_lowercase


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_params(run_dir: Path) -> list[np.ndarray]:
    return read_params(run_dir / "checkpoints" / str(STEPS) / "state")


def toy_task(path: Path, n: int = 40, seed: int = 0) -> Path:
    """Continue a run of the alphabet by three letters; three random distractors (chance: 1/4)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        start = rng.randrange(26)
        right = "".join(LETTERS[(start + 6 + j) % 26] for j in range(3))
        wrong = set()
        while len(wrong) < 3:
            wrong.add("".join(rng.choice(LETTERS) for _ in range(3)))
        choices = sorted(wrong - {right})[:3] + [right]
        rng.shuffle(choices)
        lines.append(json.dumps({"context": "".join(LETTERS[(start + j) % 26] for j in range(6)),
                                 "choices": choices, "label": choices.index(right)}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mixture")
    text = root / "text.txt"
    text.write_text((ROOT / "theseus" / "training" / "trainer.py").read_text() * 3)
    return {"root": root, "text": text, "task": toy_task(root / "toy.jsonl")}


def command(files: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return ["-m", "theseus.run", "+experiment=gpt_tiny_mixture", f"data.path={files['text']}",
            f"data.cache_dir={files['root'] / 'cache'}", f"trainer.max_steps={STEPS}", "trainer.log_every=1",
            "trainer.eval_every=6", "trainer.eval_batches=2", "trainer.checkpoint_every=3",
            "optimizer.schedule=constant", "optimizer.warmup_steps=2", "logger.mode=disabled",
            f"evaluation.multiple_choice.toy={files['task']}", f"hydra.run.dir={run_dir}", *extra]


def train(*args: str) -> None:
    proc = run_python(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def straight(files, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("straight")
    train(*command(files, run_dir))
    return run_dir


@pytest.mark.slow
def test_a_mixture_run_logs_each_source_and_task_and_resumes_bit_for_bit(files, straight, tmp_path):
    train(*command(files, tmp_path, "trainer.max_steps=5"))  # stopped after step 5 (checkpoint 5)...
    train(*command(files, tmp_path))  # ...and resumed to the end
    losses = {r["step"]: r["loss"] for r in rows(straight) if "loss" in r}
    assert {r["step"]: r["loss"] for r in rows(tmp_path) if "loss" in r} == losses and len(losses) == STEPS
    for a, b in zip(final_params(tmp_path), final_params(straight), strict=True):
        np.testing.assert_array_equal(a, b)
    evaluation = [r for r in rows(straight) if "val_loss" in r][-1]
    keys = {"val_loss", "val_bpb", "val_loss/stdlib", "val_bpb/stdlib", "val_loss/text", "val_bpb/text",
            "eval/toy/acc", "eval/toy/acc_norm"}
    assert keys <= set(evaluation)
    weighted = 0.7 * evaluation["val_loss/stdlib"] + 0.3 * evaluation["val_loss/text"]
    assert evaluation["val_loss"] == pytest.approx(weighted, rel=1e-6)
    assert evaluation["val_loss/stdlib"] != evaluation["val_loss/text"]


@pytest.mark.slow
def test_each_source_s_loss_equals_that_source_evaluated_alone(files, straight):
    run = load_trained(straight)
    with configuration(run.cfg):
        data = configure(DataConfig)
    sharding = NamedSharding(run.mesh, PartitionSpec(("data", "fsdp"), None))

    def metrics(dataset) -> dict[str, float]:
        from theseus.tasks.lm import LanguageModeling, cross_entropy

        def loss(params, tokens):  # an eval step of its own, not the trainer's
            logits = run.model.apply({"params": params}, tokens[:, :-1], deterministic=True)
            return cross_entropy(logits, tokens[:, 1:]), {}

        evaluations = load_evaluations(EvaluationConfig(), dataset, run.model, data.seed, prefetch=0)
        return evaluate(run.params, evaluations, loss=jax.jit(loss), val_metrics=LanguageModeling().val_metrics,
                        sharding=sharding, rules=(), share=(0, 1), batch_size=16, batches=2)

    mixed = metrics(open_dataset(data))
    for name, (source, _) in data.sources().items():
        alone = metrics(open_dataset(source))
        assert set(alone) == {"val_loss", "val_bpb"}
        assert mixed[f"val_loss/{name}"] == pytest.approx(alone["val_loss"], rel=1e-6)
        assert mixed[f"val_bpb/{name}"] == pytest.approx(alone["val_bpb"], rel=1e-6)
    logged = [r for r in rows(straight) if "val_loss" in r][-1]
    assert mixed["val_loss"] == pytest.approx(logged["val_loss"], rel=1e-5)


@pytest.mark.slow
def test_evaluate_a_checkpoint_reproduces_the_logged_evaluation(files, straight, tmp_path):
    """On 8 devices (the run's mesh over all of them) as the run logged on one; then on one."""
    proc = run_python("-m", "theseus.evaluate", str(straight), cwd=tmp_path, devices=8)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = json.loads((straight / f"eval-{STEPS}.json").read_text())
    assert proc.stdout.endswith(f"wrote {straight}/eval-{STEPS}.json (each example's scores: "
                                f"{straight}/eval-{STEPS}.jsonl)\n")  # into the run: said, not silent
    logged = [r for r in rows(straight) if "val_loss" in r][-1]
    assert written["step"] == STEPS and set(written["metrics"]) == set(logged) - {"step"}
    assert written["mesh"] == {"data": 8, "fsdp": 1, "expert": 1, "tensor": 1}
    for key, value in written["metrics"].items():
        assert value == pytest.approx(logged[key], rel=1e-5, abs=1e-9), key
        assert key in proc.stdout
    samples = [json.loads(line) for line in (straight / f"eval-{STEPS}.jsonl").read_text().splitlines()]
    assert [(s["task"], s["index"]) for s in samples] == [("toy", i) for i in range(40)]
    for metric in ("acc", "acc_norm", "acc_bytes"):  # the totals are the per-example scores' means
        assert np.mean([s[metric] for s in samples]) == pytest.approx(written["metrics"][f"eval/toy/{metric}"])
    assert all(s[metric] == (int(np.argmax(s["scores"])) == s["label"]) for s in samples for metric in ["acc"])
    out = tmp_path / "at6.json"
    other = toy_task(tmp_path / "other.jsonl", seed=1)
    proc = run_python("-m", "theseus.evaluate", str(straight), "--step", "6", "--out", str(out),
                      f"evaluation.multiple_choice.other={other}", "trainer.eval_batches=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {out} (each example's scores: {tmp_path / 'at6.jsonl'})" in proc.stdout
    at6 = json.loads(out.read_text())
    assert at6["step"] == 6 and {"eval/toy/acc", "eval/other/acc", "eval/other/acc_norm"} <= set(at6["metrics"])
    assert at6["metrics"]["val_loss"] != pytest.approx(written["metrics"]["val_loss"])


@pytest.mark.parametrize("extra, message", [
    (["data.path=/no/such/corpus.txt"], "data.mixture.text.path=/no/such/corpus.txt does not exist"),
    (["evaluation.multiple_choice.toy=/no/such.jsonl"], "evaluation.multiple_choice.toy=/no/such.jsonl: no such file"),
    ("empty", ":1: choices must be a non-empty list of non-empty strings, got []"),
    ("label", ":2: label must be the index of the right choice, 0 to 1, got 5"),
])
def test_bad_input_is_refused_before_training(files, tmp_path, extra, message):
    if isinstance(extra, str):
        bad = tmp_path / "bad.jsonl"
        records = {"empty": [{"context": "a", "choices": [], "label": 0}],
                   "label": [{"context": "a", "choices": ["b", "c"], "label": 0},
                             {"context": "a", "choices": ["b", "c"], "label": 5}]}[extra]
        bad.write_text("\n".join(json.dumps(r) for r in records))
        extra = [f"evaluation.multiple_choice.toy={bad}"]
    overrides = [o for o in command(files, tmp_path / "run", *extra)[2:] if not o.startswith("hydra.")]
    with pytest.raises(ConfigError) as err:
        assemble(resolve(compose(overrides)), steps=None)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_negative_weight_is_one_line_and_nothing_is_written(files, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_python(*command(files, run_dir, "data.mixture.text.weight=-1"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == ["theseus: error: data.mixture.text.weight must be positive, got -1: "
                                                "drop the source, or give it a share"]
    assert not run_dir.exists()


@pytest.mark.slow
def test_evaluate_refuses_other_keys_and_missing_steps(straight):
    proc = run_python("-m", "theseus.evaluate", str(straight), "architecture.n_layers=3")
    assert proc.returncode == 2 and proc.stderr.strip().startswith("theseus: error: 'architecture.n_layers=3': give "
                                                                   "evaluation keys as KEY=VALUE")
    proc = run_python("-m", "theseus.evaluate", str(straight), "--step", "7")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"theseus: error: {straight / 'checkpoints'} has no checkpoint of step 7: "
                                   "saved steps are 6, 9, 12")  # the newest 3 kept


@pytest.mark.slow
def test_a_tiny_model_learns_the_toy_task_well_above_chance(files, tmp_path):
    """60 steps on runs of the alphabet: the right continuation wins far above chance (1/4), and
    the same examples labelled with a wrong choice score far below it."""
    rng = random.Random(1)
    corpus = tmp_path / "alphabet.txt"
    corpus.write_text("".join("".join(LETTERS[(s + j) % 26] for j in range(rng.randrange(5, 30))) + "\n"
                              for s in (rng.randrange(26) for _ in range(3000))))
    mislabelled = tmp_path / "mislabelled.jsonl"
    records = [json.loads(line) for line in files["task"].read_text().splitlines()]
    mislabelled.write_text("".join(json.dumps({**r, "label": (r["label"] + 1) % 4}) + "\n" for r in records))
    run_dir = tmp_path / "run"
    train("-m", "theseus.run", "+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}",
          f"data.cache_dir={tmp_path / 'cache'}", "trainer.eval_every=0", "trainer.eval_batches=1",
          "trainer.checkpoint_every=0", "logger.mode=disabled", f"evaluation.multiple_choice.toy={files['task']}",
          f"evaluation.multiple_choice.mislabelled={mislabelled}", f"hydra.run.dir={run_dir}")
    final = [r for r in rows(run_dir) if "eval/toy/acc" in r][-1]
    assert final["step"] == 60 and math.isfinite(final["val_loss"])
    assert final["eval/toy/acc"] >= 0.8 and final["eval/toy/acc_norm"] >= 0.8
    assert final["eval/mislabelled/acc"] <= 0.2


def test_a_resume_may_add_evaluations_but_not_change_the_mixture():
    from theseus.training.resume import unsafe_changes

    saved = {"data": {"mixture": {"a": {"source": "stdlib", "weight": 0.7}}}, "evaluation": {"multiple_choice": {}}}
    assert unsafe_changes(saved, {**saved, "evaluation": {"multiple_choice": {"toy": "toy.jsonl"}}}) == []
    heavier = {**saved, "data": {"mixture": {"a": {"source": "stdlib", "weight": 0.9}}}}
    assert unsafe_changes(saved, heavier) == [("data.mixture.a.weight", 0.7, 0.9)]
