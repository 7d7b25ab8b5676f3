"""task=dpo as a user runs it: LoRA adapters on a tiny Llama folder, whose base is the reference
(the log-probs the cache keeps are transformers' of the folder); a short run raises
``rewards/accuracies`` and ``rewards/margins`` on held-out pairs, as TRL scores its export, and
``theseus.evaluate`` of the export gives TRL's numbers; the run stopped and continued is
bit-identical to the run never stopped; ``theseus.evaluate RUN`` gives the run's own validation
numbers, or scores a file as its export does (bad rows: tests/e2e/test_bad_input.py; the full
fine-tune: the README's section)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from e2e.test_next_commands import next_commands, shell
from support import read_params, run_python
from tasks.dpo_folders import random_llama, transformers, transformers_logps, write_rows

from theseus.data.config import DataConfig

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")


def pairs(numbers) -> list[dict]:
    """A preference that generalises: a calm lowercase reply over a shouted one, whatever the number."""
    return [{"prompt": [{"role": "user", "content": f"Tell me about {n}."}],
             "chosen": [{"role": "assistant", "content": f"i like {n}, it is a fine number."}],
             "rejected": [{"role": "assistant", "content": f"I HATE {n}!!"}]} for n in numbers]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """``policy/`` (a tiny Llama with a ChatML tokenizer), ``train.jsonl`` and held-out ``heldout.jsonl``."""
    base = tmp_path_factory.mktemp("dpo-e2e")
    random_llama(base / "policy", seed=0)
    write_rows(base / "train.jsonl", pairs(range(0, 240, 2)))
    write_rows(base / "heldout.jsonl", pairs(range(1, 48, 2)))
    return base


def train(project: Path, run: str, *overrides: str):
    return run_python("-m", "theseus.run", "task=dpo", f"trainer.init_from={project / 'policy'}", "data.source=jsonl",
                      "data.path=train.jsonl", "data.val_fraction=0.1", f"data.cache_dir={project / 'cache'}",
                      "trainer.batch_size=8", "trainer.log_every=1", "trainer.eval_every=4", "trainer.checkpoint_every=4",
                      "architecture.lora.rank=8", "architecture.lora.targets=[q,k,v,o,gate,up,down]",
                      "optimizer.lr=5e-3", "optimizer.schedule=constant", "optimizer.warmup_steps=2",
                      "logger.mode=disabled", f"hydra.run.dir={run}", *overrides, cwd=project)


def logged(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def trl_scores(model: Path, reference: Path, rows: Path) -> dict[str, float]:
    """TRL's ``evaluate()`` of ``model`` against ``reference`` on every pair of ``rows``, one batch."""
    data = datasets.Dataset.from_list([json.loads(line) for line in rows.read_text().splitlines()])
    load = transformers.AutoModelForCausalLM.from_pretrained
    args = trl.DPOConfig(output_dir=str(model.parent / "trl"), bf16=False, use_cpu=True, report_to=[],
                         per_device_eval_batch_size=len(data))
    trainer = trl.DPOTrainer(load(model), ref_model=load(reference), args=args, train_dataset=data, eval_dataset=data,
                             processing_class=transformers.AutoTokenizer.from_pretrained(model))
    return trainer.evaluate()


def test_a_short_lora_run_learns_the_preference_against_its_base_and_resumes_bit_identically(project):
    from theseus.data.preferences import prepare_pairs

    straight, stopped, cache = project / "straight", project / "stopped", project / "cache"
    proc = train(project, straight, "trainer.max_steps=8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    offered = next_commands(proc.stderr)
    rows = logged(straight)
    assert rows[0]["step"] == 0 and rows[0]["val_loss"] == pytest.approx(math.log(2))  # B = 0: the policy is its base
    assert rows[0]["val_rewards/accuracies"] == 0 and rows[0]["val_rewards/margins"] == 0
    train_lines = [row for row in rows if "loss" in row]
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
            "logps/rejected"} <= set(train_lines[-1])
    assert rows[-1]["val_rewards/accuracies"] > 0.9 and rows[-1]["val_rewards/margins"] > 0.1

    # the reference's log-probs, computed once with the start's params (the base, adapters off), as transformers'
    [reference] = cache.glob("reference-*")
    data = DataConfig(source="jsonl", path=str(project / "train.jsonl"), val_fraction=0.1, cache_dir=str(cache),
                      tokenizer=str(project / "policy" / "tokenizer.json"))
    np.testing.assert_allclose(np.load(reference / "logps.npy"),
                               transformers_logps(project / "policy", prepare_pairs(data).pairs), rtol=1e-4)

    # held-out pairs, scored by TRL on the (merged) export against the base; theseus.evaluate gives the same numbers
    proc = run_python("-m", "theseus.export", str(straight), str(project / "export"), cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = trl_scores(project / "export", project / "policy", project / "heldout.jsonl")
    assert scores["eval_rewards/accuracies"] > 0.9 and scores["eval_rewards/margins"] > 0.1, scores
    proc = run_python("-m", "theseus.evaluate", str(project / "export"), "task=dpo", "data.source=jsonl",
                      "data.path=heldout.jsonl", f"dpo.reference={project / 'policy'}", f"data.cache_dir={cache}",
                      "--out", "heldout.json", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = json.loads((project / "heldout.json").read_text())["metrics"]
    for name in ("loss", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected"):
        assert ours[f"val_{name}"] == pytest.approx(scores[f"eval_{name}"], rel=1e-4, abs=1e-6), name

    # the run itself scored on the file (MODEL_OR_RUN: its adapters over the base), as its export is
    proc = run_python("-m", "theseus.evaluate", str(straight), "task=dpo", "data.source=jsonl",
                      "data.path=heldout.jsonl", f"dpo.reference={project / 'policy'}", f"data.cache_dir={cache}",
                      "--out", "run-heldout.json", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].endswith("; scored every example of data.path=heldout.jsonl"), proc.stdout
    run_scores = json.loads((project / "run-heldout.json").read_text())["metrics"]
    assert run_scores == pytest.approx(ours, rel=1e-4, abs=1e-6)
    # the evaluate: line the run printed (no data named): its validation pairs, the numbers its last evaluation logged
    proc = shell(offered["evaluate"], project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].endswith("; scored the run's validation split"), proc.stdout
    own = json.loads((straight / "eval-8.json").read_text())
    assert own["step"] == 8 and own["split"] == "val"
    assert own["metrics"] == pytest.approx({key: rows[-1][key] for key in own["metrics"]}, rel=1e-6)

    # stopped at step 4, then continued to 8 in place: the same steps, bit for bit
    for steps in (4, 8):
        proc = train(project, stopped, f"trainer.max_steps={steps}")
        assert proc.returncode == 0, proc.stderr[-3000:]
    resumed, whole = (read_params(run / "checkpoints" / "8" / "state") for run in (stopped, straight))
    assert len(resumed) == len(whole) and all(np.array_equal(a, b) for a, b in zip(resumed, whole))
    assert [row for row in logged(stopped) if "loss" in row][-1]["loss"] == train_lines[-1]["loss"]
