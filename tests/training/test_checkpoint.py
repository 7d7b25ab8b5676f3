"""Checkpoints as a user meets them from the command line: resume, preemption, crashes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support import ROOT, read_params, run_python

STEPS = 12


def command(corpus: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "theseus.run", "+experiment=gpt_tiny", "data.source=text",
            f"data.path={corpus}", f"data.cache_dir={corpus.parent / 'cache'}", f"trainer.max_steps={STEPS}",
            "trainer.log_every=1", "trainer.eval_every=6", "trainer.eval_batches=1", "trainer.checkpoint_every=3",
            "architecture.dropout=0.1", "logger.mode=disabled", f"hydra.run.dir={run_dir}", *extra]


def env() -> dict:
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def start_and_interrupt(cmd: list[str], after_step: int, sig: int) -> subprocess.Popen:
    """Start a run and send ``sig`` once it has logged ``after_step``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), cwd=ROOT)
    for line in proc.stdout:
        if line.startswith(f"step {after_step}/"):
            proc.send_signal(sig)
            break
    proc.output = proc.stdout.read()
    proc.wait(timeout=600)
    return proc


def losses(run_dir: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line["loss"] for line in lines if "loss" in line}


def final_params(run_dir: Path) -> list[np.ndarray]:
    """The params of the newest checkpoint, read back with Orbax (no theseus code involved)."""
    return read_params(run_dir / "checkpoints" / str(STEPS) / "state")


@pytest.fixture(scope="module")
def straight(corpus, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("straight")
    run(command(corpus, run_dir))
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["threads", "process"])  # trainer.checkpoint_writer: auto is threads on a CPU
def test_sigterm_saves_and_resume_is_bit_exact(corpus, straight, tmp_path, writer):
    proc = start_and_interrupt(command(corpus, tmp_path, f"trainer.checkpoint_writer={writer}"), after_step=4,
                               sig=signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, proc.output[-2000:]
    stopped = max(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert 4 <= stopped < STEPS
    assert f"theseus: SIGTERM received: stopping after step {stopped}: saving a checkpoint" in proc.output
    assert f"interrupted by SIGTERM after step {stopped}/{STEPS}; checkpoint {stopped} saved" in proc.output
    resume = command(corpus, tmp_path, f"trainer.checkpoint_writer={writer}")
    assert f"resume:   python -m theseus.run {' '.join(resume[3:])}\n" in proc.output
    run(resume)
    assert losses(tmp_path) == losses(straight)  # identical, step by step
    for a, b in zip(final_params(tmp_path), final_params(straight), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["threads", "process"])
def test_kill_9_at_any_moment_then_the_same_command_finishes_identically(corpus, straight, tmp_path, writer):
    # a checkpoint every step: a write is nearly always under way
    cmd = command(corpus, tmp_path, "trainer.checkpoint_every=1", f"trainer.checkpoint_writer={writer}")
    for after in (2, 5, 9):
        proc = start_and_interrupt(cmd, after_step=after, sig=signal.SIGKILL)
        assert proc.returncode == -signal.SIGKILL
    run(cmd)
    assert losses(tmp_path)[STEPS] == losses(straight)[STEPS]
    for a, b in zip(final_params(tmp_path), final_params(straight), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_damaged_latest_checkpoint_falls_back_to_the_previous(corpus, straight, tmp_path):
    import shutil

    shutil.copytree(straight, tmp_path, dirs_exist_ok=True)
    for array_file in (tmp_path / "checkpoints" / str(STEPS) / "state").rglob("*"):
        if array_file.is_file() and array_file.stat().st_size > 1000:
            array_file.write_bytes(array_file.read_bytes()[:100])  # truncated
    proc = run(command(corpus, tmp_path))
    report = [line for line in proc.stderr.splitlines() if "unreadable" in line]
    assert len(report) == 1 and f"checkpoints/{STEPS} is unreadable" in report[0] and "kept as damaged-" in report[0]
    assert "resuming from" in proc.stderr and f"at step {STEPS - 3}" in proc.stderr
    assert losses(tmp_path)[STEPS] == losses(straight)[STEPS]


@pytest.mark.slow
def test_resume_never_refuses_a_used_directory(corpus, straight):
    before = sorted(p.name for p in (straight / "checkpoints").iterdir())
    proc = run_python("-m", "theseus.run", *command(corpus, straight, "trainer.resume=never")[3:])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"theseus: error: {straight} already has checkpoints and trainer.resume=never: "
        "choose a new hydra.run.dir, or trainer.resume=auto to continue it"]
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == before


@pytest.mark.slow
def test_restore_onto_other_meshes(corpus, tmp_path):
    """Saved sharded with fsdp=8, its step-6 checkpoint restored on one device: the same run."""
    import shutil

    sharded, single = tmp_path / "fsdp8", tmp_path / "one"
    cmd = command(corpus, sharded, "trainer.keep_checkpoints=4")[3:]
    first = run_python("-m", "theseus.run", *cmd, "mesh.data=1", "mesh.fsdp=8", devices=8)
    assert first.returncode == 0, first.stderr[-2000:]
    shutil.copytree(sharded, single)
    for later in (9, 12):
        shutil.rmtree(single / "checkpoints" / str(later))
    proc = run_python("-m", "theseus.run", *command(corpus, single, "trainer.keep_checkpoints=4")[3:], devices=1)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resuming from" in proc.stderr and "at step 6" in proc.stderr
    assert f"step {STEPS}/{STEPS} loss" in proc.stderr + proc.stdout  # logged by the resumed run (its log is cut at 6)
    resumed, straight = losses(single), losses(sharded)
    assert [resumed[s] for s in range(7, STEPS + 1)] == pytest.approx([straight[s] for s in range(7, STEPS + 1)],
                                                                      rel=1e-4)


@pytest.mark.slow
def test_resume_with_a_changed_config_is_refused_with_the_diff(corpus, straight, tmp_path):
    import shutil

    shutil.copytree(straight, tmp_path, dirs_exist_ok=True)
    saved = (tmp_path / ".hydra" / "config.yaml").read_text()
    proc = run_python("-m", "theseus.run", *command(corpus, tmp_path, "optimizer.lr=0.01", "architecture.n_layers=3")[3:])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"theseus: error: cannot resume {tmp_path} with a changed config (architecture.n_layers: 2 -> 3, "
        "optimizer.lr: 0.003 -> 0.01): these alter shapes, data order or the optimizer; revert them, "
        "or use a new hydra.run.dir"]
    assert (tmp_path / ".hydra" / "config.yaml").read_text() == saved  # nothing overwritten
    harmless = run_python("-m", "theseus.run", *command(corpus, tmp_path, "trainer.log_every=4", "trainer.eval_batches=2")[3:])
    assert harmless.returncode == 0, harmless.stderr[-2000:]
    assert "is complete at step 12: nothing to train" in harmless.stdout + harmless.stderr


def test_resume_rules():
    from theseus.config import ConfigError
    from theseus.training.resume import check_resume, unsafe_changes

    saved = {"optimizer": {"schedule": "cosine"}, "trainer": {"max_steps": 100, "log_every": 5}}
    extended = {"optimizer": {"schedule": "cosine"}, "trainer": {"max_steps": 200, "log_every": 1}}
    assert unsafe_changes(saved, extended) == [("trainer.max_steps", 100, 200)]
    check_resume("RUN", saved, extended, max_steps_problem=None)  # the schedule keeps the past: allowed
    with pytest.raises(ConfigError, match=r"^cannot continue RUN to trainer.max_steps=200: the past changes$"):
        check_resume("RUN", saved, extended, max_steps_problem="the past changes")


def test_a_key_declared_since_a_run_was_saved_is_no_change_at_its_default():
    """A run saved before a layer gained a field (``architecture.qk_norm``) resumes; the field set
    away from its default is a change."""
    from omegaconf import OmegaConf

    from theseus.config.compose import compose
    from theseus.training.resume import unsafe_changes

    new = OmegaConf.to_container(compose(["+experiment=gpt_tiny"]), resolve=True)
    saved = {**new, "architecture": {k: v for k, v in new["architecture"].items() if k != "qk_norm"}}
    assert unsafe_changes(saved, new) == []
    changed = OmegaConf.to_container(compose(["+experiment=gpt_tiny", "architecture.qk_norm=true"]), resolve=True)
    assert unsafe_changes(saved, changed) == [("architecture.qk_norm", None, True)]


@pytest.mark.parametrize(("schedule", "steps", "allowed"), [
    ("constant", 40, True), ("wsd", 40, True), ("wsd", 90, False), ("cosine", 40, False)])
def test_extension_follows_the_schedule(tmp_path, schedule, steps, allowed):
    """A run stopped at ``steps`` of 100 extends to 200 when its learning rates so far would
    not change: a constant, wsd before its decay (the last 20%), never a cosine."""
    from theseus.config.compose import compose
    from theseus.training.settings import configure_settings
    from theseus.training.resume import extension_problem

    (tmp_path / "checkpoints" / str(steps)).mkdir(parents=True)
    cfg = compose(["+experiment=gpt_tiny", f"optimizer.schedule={schedule}", "trainer.max_steps=200"])
    settings = configure_settings(cfg)
    problem = extension_problem(tmp_path, 100, settings.optimizer, settings.trainer.max_steps)
    assert (problem is None) == allowed, problem


def test_a_constant_run_shorter_than_its_warmup_is_refused_saying_so(tmp_path):
    """Its warmup was cut to its length (gpt_tiny warms up over 10 steps): longer, its steps
    would have had other rates."""
    from theseus.config.compose import compose
    from theseus.training.settings import configure_settings
    from theseus.training.resume import extension_problem

    (tmp_path / "checkpoints" / "5").mkdir(parents=True)
    cfg = compose(["+experiment=gpt_tiny", "optimizer.schedule=constant", "trainer.max_steps=200"])
    settings = configure_settings(cfg)
    problem = extension_problem(tmp_path, 5, settings.optimizer, settings.trainer.max_steps)
    assert problem.endswith("a constant schedule extends in place only once its warmup (optimizer.warmup_steps=10) "
                            "is over"), problem


def test_a_learning_rate_that_would_change_a_little_is_told_in_digits_that_differ(tmp_path):
    """A cosine of 100 steps taken to 40, extended by one step: its rates move in the 5th digit,
    and the refusal shows the digits that differ (not "would have been 0.003, not 0.003")."""
    import re

    import numpy as np

    from theseus.config.compose import compose
    from theseus.training.optimizer import make_schedule
    from theseus.training.resume import extension_problem
    from theseus.training.settings import configure_settings

    (tmp_path / "checkpoints" / "40").mkdir(parents=True)
    optimizer = configure_settings(compose(["+experiment=gpt_tiny", "optimizer.schedule=cosine"])).optimizer
    problem = extension_problem(tmp_path, 100, optimizer, 101)
    step, would, was = re.search(r"learning rate of step (\d+) .* would have been (\S+), not (\S+)\. ", problem).groups()
    expected = (float(np.asarray(make_schedule(optimizer, n)(int(step) - 1))) for n in (101, 100))
    assert would != was and f"{float(would):.3g}" == f"{float(was):.3g}"  # apart, in more digits than 3
    assert [float(would), float(was)] == pytest.approx(list(expected), rel=1e-5)


def test_resume_last_finds_the_furthest_unfinished_run_this_command_started(tmp_path, monkeypatch):
    """Among the runs in Hydra's default folders that the same command started (its overrides,
    up to their order, trainer.resume and trainer.max_steps; none given hydra.run.dir) whose
    saved config this one may continue: the furthest unfinished (the newest of equals), the
    others unfinished beside it; with none unfinished, the newest."""
    import time

    from omegaconf import OmegaConf

    from theseus.config.compose import compose
    from theseus.training.resume import last_run, runs_root, started_runs

    monkeypatch.chdir(tmp_path)
    command = ["+experiment=gpt_tiny", "optimizer.lr=3e-3"]

    def made(name: str, config: dict, overrides=command, hydra=(), steps: tuple[int, ...] = (5,)) -> Path:
        run_dir = Path("outputs") / name
        (run_dir / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create(config), run_dir / ".hydra" / "config.yaml")
        OmegaConf.save(OmegaConf.create(list(overrides)), run_dir / ".hydra" / "overrides.yaml")
        OmegaConf.save(OmegaConf.create({"hydra": {"overrides": {"hydra": list(hydra), "task": list(overrides)}}}),
                       run_dir / ".hydra" / "hydra.yaml")
        for step in steps:
            (run_dir / "checkpoints" / str(step)).mkdir(parents=True)
        time.sleep(0.01)  # distinct modification times: the newest wins
        return run_dir

    lr3 = {"optimizer": {"lr": 3e-3}, "trainer": {"max_steps": 60, "resume": "auto"}}
    older = made("d1/t1", lr3, overrides=[*reversed(command), "trainer.resume=last"])  # the same command
    other = made("d1/t2", {**lr3, "optimizer": {"lr": 1e-3}}, overrides=["+experiment=gpt_tiny", "optimizer.lr=1e-3"])
    newer = made("d2/t1", {**lr3, "logger": {"mode": "disabled"}})  # logging may differ
    made("d2/t2", lr3, steps=())  # no checkpoint: nothing to continue
    made("d2/t3", lr3, overrides=[*command, "evaluation.lm_eval=[x]"])  # another command
    made("d3/t1", lr3, hydra=["hydra.run.dir=outputs/d3/t1"])  # its own hydra.run.dir: another command's
    made("lm-eval", lr3, hydra=["hydra.run.dir=outputs/lm-eval"])
    composed = compose([*command, "trainer.max_steps=90", "trainer.resume=last"], hydra=True)
    runs = started_runs(composed)
    assert sorted(runs) == [older, newer, Path("outputs/d2/t2")]
    again = {"optimizer": {"lr": 3e-3}, "trainer": {"max_steps": 90, "resume": "last"}}  # longer: judged later
    assert last_run(runs, again) == (newer, [older])  # both at step 5: the newest
    assert last_run(runs, {**again, "optimizer": {"lr": 1e-2}}) == (None, [])
    (older / "checkpoints" / "50").mkdir()  # further than the newer run: the one a user means
    assert last_run(runs, again) == (older, [newer])
    assert last_run(runs, {**again, "trainer": {"max_steps": 5}}) == (older, [])  # none unfinished: the newest
    assert started_runs(compose(["+experiment=gpt_tiny", "optimizer.lr=1e-3"], hydra=True)) == [other]
    assert runs_root(composed) == Path("outputs")
    assert runs_root(compose(["+experiment=gpt_tiny", "hydra.run.dir=runs/a"], hydra=True)) is None


def test_resumable_keys_are_declared_with_their_fields(monkeypatch):
    """Which keys a resume lets change is read off the declarations: a field's ``resumable``,
    else its class's ``RESUMABLE`` (every key of the logger, mesh, ... groups); an option a
    user registers takes part as theseus's own do."""
    import dataclasses

    from theseus.config import Configurable, field, register, registry
    from theseus.training.resume import resumable_keys, unsafe_changes

    registry.load()
    monkeypatch.setitem(registry._OPTIONS, "probe", {})  # gone after the test
    @register("probe", "resumable")
    @dataclasses.dataclass(frozen=True)
    class Probe(Configurable):
        cadence: int = field("probe.cadence", default=1, resumable=True)
        width: int = field("probe.width", default=1)

    keys = resumable_keys()
    assert {"trainer.log_every", "architecture.remat", "mesh.fsdp", "logger.mode", "probe.cadence"} <= keys
    assert not {"trainer.batch_size", "architecture.d_model", "optimizer.lr", "probe.width"} & keys
    saved = {"probe": {"cadence": 1, "width": 1}, "mesh": {"rules": {"embed": "fsdp"}}}
    new = {"probe": {"cadence": 5, "width": 2}, "mesh": {"rules": {"embed": None}}}
    assert unsafe_changes(saved, new) == [("probe.width", 1, 2)]
