"""task=grpo as a user runs it: the README's section, whole, in a folder outside the checkout (its
task made there, an SFT start, ``grpo_tiny`` from it, a reply sampled), raises the sampled reward
and the held-out greedy accuracy; a reward function that fails stops the run in one line after a
checkpoint; the run continued from it takes the steps the stopped run would have (its steps
before the failure are the reference), and so does a run resumed from a checkpoint taken between
the steps that reuse a batch of completions: the same metrics, bit-identical weights."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from e2e import test_readme
from e2e.test_readme import SECTIONS, project, script

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

TITLE = "RL with verifiable rewards (GRPO)"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[Path, dict[str, str], str]:
    """The README's GRPO section run as written, unshortened: ``(folder, environment, output)``."""
    base = tmp_path_factory.mktemp("grpo")
    env = project(base, needs_model=False)
    with mock.patch.dict(test_readme.SHORTEN, clear=True):  # as written: test_readme shortens it
        body = script(SECTIONS[TITLE], set())
    proc = subprocess.run(["bash", "-c", body], cwd=base, env=env, capture_output=True, text=True, timeout=1200)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in output, output[-6000:]
    return base, env, output


TIMES = ("step_time", "rollout_time", "tokens_per_s", "flops_per_s", "mfu", "data_wait")


def rows(run: Path) -> list[dict]:
    """``run``'s logged lines, times left out (what a resumed run must repeat exactly)."""
    return [{key: value for key, value in json.loads(line).items() if key not in TIMES}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_readme_run_raises_its_reward_and_held_out_accuracy(folder):
    base, _, output = folder
    run = base / "outputs" / "reverse-grpo"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluations = [row for row in logged if "val_reward" in row]
    steps = [row for row in logged if "reward" in row]
    assert [row["step"] for row in evaluations] == [0, 25, 50, 75, 100]
    assert evaluations[-1]["val_reward"] >= evaluations[0]["val_reward"] + 0.2, evaluations
    # the sampled reward (temperature 1, 32 completions a step) rises less surely: each processor's float
    # rounding sends the run its own way (README: 19% -> 48% right on an EPYC, 25% -> 30% on a Xeon)
    sampled = [row["reward"] for row in steps]
    assert np.mean(sampled[-3:]) > np.mean(sampled[:3]), sampled
    for key in ("reward_std", "rewards/correct/mean", "frac_reward_zero_std", "completion_length", "clip_ratio",
                "rollout_time", "completions/clipped_ratio"):
        assert key in steps[-1], key
    assert "kl" not in steps[-1]  # grpo.beta 0: no reference
    assert 0 < steps[-1]["rollout_time"] < steps[-1]["step_time"]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {0, 25, 50, 75, 100} and set(samples[0]) == {"step", "prompt", "completion",
                                                                                        "correct"}
    assert "  sample: 'reverse " in (run / "run.log").read_text()
    offered = output.split("theseus run summary")[-1]  # the GRPO run's end: trained on chats, it is talked to
    chat = r"^  sample: +python -m theseus.sample \S*outputs/reverse-grpo --chat \"\.\.\.\"$"
    assert re.search(chat, offered, re.M), offered
    reply = output.split("$ python -m theseus.sample outputs/reverse-grpo", 1)[1].splitlines()[1]
    assert re.fullmatch("[a-h]{4}", reply.strip()), reply  # the chat template's reply: a word


FLAKY = """
import os

calls = 0


def correct(prompts, completions, completion_ids, answer, **kwargs):
    global calls
    calls += 1
    if str(calls) == os.environ.get("FAIL_AT"):
        return [1 / 0 for _ in prompts]
    return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]
"""


def test_a_failing_reward_stops_in_one_line_and_every_resume_is_bit_identical(folder, monkeypatch):
    base, env, _ = folder
    (base / "flaky.py").write_text(FLAKY)
    # 80 held-out prompts are 5 calls at step 0 (batches of 16), then one call a rollout: steps 1, 3, 5 (mu = 2)
    command = [sys.executable, "-m", "theseus.run", "+experiment=grpo_tiny", "trainer.init_from=outputs/reverse-sft",
               "grpo.reward=flaky:correct", "grpo.num_iterations=2", "grpo.beta=0.04", "trainer.batch_size=16",
               "trainer.max_steps=6", "trainer.log_every=1", "trainer.eval_every=0", "trainer.checkpoint_every=3",
               "trainer.keep_checkpoints=4", "logger.mode=disabled"]

    def theseus(run: str, *extra: str, fail_at: int | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([*command, f"hydra.run.dir={run}", *extra], cwd=base, capture_output=True, text=True,
                              env={**env, **({"FAIL_AT": str(fail_at)} if fail_at else {})}, timeout=600)

    failed = theseus("outputs/stopped", fail_at=8)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert failed.stderr.strip().splitlines()[-1].startswith(
        "theseus: error: grpo.reward flaky:correct raised ZeroDivisionError: division by zero on the prompt 'reverse ")
    assert failed.stderr.strip().endswith("(making step 5); checkpoint step 4 saved: fix it and run the same command "
                                          "to resume")
    uninterrupted = rows(base / "outputs" / "stopped")  # steps 0 to 4, then the failure
    assert [row["step"] for row in uninterrupted if "loss" in row] == [1, 2, 3, 4]
    again = theseus("outputs/stopped")
    assert again.returncode == 0 and "resuming from" in again.stderr + again.stdout, again.stderr[-3000:]
    # from checkpoint 3 (saved every 3 steps), between the two steps on the completions sampled at step 3
    between = theseus("outputs/between", f"trainer.resume={base / 'outputs' / 'stopped' / 'checkpoints' / '3'}")
    assert between.returncode == 0, between.stderr[-3000:]

    resumed = rows(base / "outputs" / "stopped")
    assert resumed[:len(uninterrupted)] == uninterrupted and [row["step"] for row in resumed][-3:] == [5, 6, 6]
    assert rows(base / "outputs" / "between") == [row for row in resumed if row["step"] > 3]
    assert all("kl" in row for row in resumed if "loss" in row)
    monkeypatch.chdir(base)  # the runs' relative paths (their data, their start)
    for a, b in zip(params(base / "outputs" / "stopped"), params(base / "outputs" / "between"), strict=True):
        np.testing.assert_array_equal(a, b)


def params(run: Path) -> list[np.ndarray]:
    """The final checkpoint's params of ``run``, as numpy arrays in a fixed order."""
    import jax

    from theseus.cli.trained import load_trained

    return [np.asarray(leaf) for leaf in jax.tree.leaves(load_trained(run).params)]


def test_a_step_is_the_same_on_any_mesh_and_accumulation(folder):
    """One device, or two with the batch in two micro-batches: the same completions (each keyed by
    its place in the step), rewards, advantages and, up to float summation order, losses and
    gradients (dapo normalised over the step's tokens, as TRL's ``num_items_in_batch``)."""
    base, env, _ = folder
    command = [sys.executable, "-m", "theseus.run", "+experiment=grpo_tiny", "trainer.init_from=outputs/reverse-sft",
               "trainer.batch_size=16", "trainer.max_steps=3", "trainer.log_every=1", "trainer.eval_every=0",
               "logger.mode=disabled"]
    logged = {}
    for name, layout in (("one", ["mesh.cpu_devices=1"]), ("two", ["mesh.cpu_devices=2", "trainer.grad_accum=2"])):
        proc = subprocess.run([*command, *layout, f"hydra.run.dir=outputs/{name}"], cwd=base, capture_output=True,
                              text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        logged[name] = [row for row in rows(base / "outputs" / name) if "loss" in row]
    for one, two in zip(logged["one"], logged["two"], strict=True):
        for key in ("reward", "rewards/correct/mean", "completion_length", "frac_reward_zero_std"):
            assert one[key] == two[key], key
        for key in ("loss", "grad_norm", "clip_ratio"):
            assert one[key] == pytest.approx(two[key], rel=1e-5, abs=1e-7), key
