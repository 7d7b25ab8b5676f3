"""SLURM for real, through ``hydra/launcher=slurm``, on a single-node cluster (``.ci/run`` starts
one as root with ``.ci/setup-slurm.sh``; without it these tests skip, saying why).

A job whose time limit is shorter than its run saves at SLURM's warning, requeues itself and
finishes, each segment resuming from the checkpoint taken at the signal; ``scancel`` of a 2-task job leaves a
checkpoint of the step acknowledged and a sweep summary row ``preempted``, resumable, whose
printed resume command finishes the job. gpt_tiny on the CPU, a 2-minute limit: ~3 minutes.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from support import ROOT

from theseus.cli.slurm import check_time_limit
from theseus.config import ConfigError


def cluster_problem() -> str | None:
    """Why no SLURM job can run here (None: one can): sinfo and sacct must answer."""
    try:
        up = subprocess.run(["sinfo", "-h", "-o", "%a"], capture_output=True, text=True, timeout=20)
        accounting = subprocess.run(["sacct", "-n", "-X", "-S", "now"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no SLURM here ({exc})"
    if up.returncode or "up" not in up.stdout.split():
        return f"no SLURM partition up (sinfo: {(up.stderr or up.stdout).strip()[:200]})"
    if accounting.returncode:
        return f"SLURM's accounting (sacct, which submitit polls) does not answer: {accounting.stderr.strip()[:200]}"
    return None


@pytest.fixture(scope="module")
def slurm():
    problem = cluster_problem()
    if problem:
        pytest.skip(f"{problem}: as root, `bash .ci/setup-slurm.sh` starts a single-node cluster")


def env() -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}


def sweep(corpus: Path, sweep_dir: Path, *extra: str) -> subprocess.Popen:
    """Start a one-job SLURM sweep of gpt_tiny into ``sweep_dir`` (output: ``sweep_dir``.log)."""
    cmd = [sys.executable, "-m", "theseus.run", "-m", "+experiment=gpt_tiny", "data.source=text",
           f"data.path={corpus}", f"data.cache_dir={corpus.parent / 'cache'}", "trainer.eval_batches=1",
           "trainer.eval_every=100000", "trainer.checkpoint_every=100000", "hydra/launcher=slurm",
           f"hydra.sweep.dir={sweep_dir}", *extra]
    log = open(f"{sweep_dir}.log", "w")  # noqa: SIM115 (the child holds it)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env(), cwd=sweep_dir.parent)


def job_id(sweep_dir: Path, timeout: float = 60) -> str:
    """The SLURM job id of the sweep's one job (submitit's folder under .submitit/)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [p.name for p in (sweep_dir / ".submitit").glob("*") if p.name.isdigit()]
        if found:
            return found[0]
        time.sleep(1)
    raise AssertionError(f"no job submitted into {sweep_dir}")


def follow(proc: subprocess.Popen, job: str, timeout: float) -> list[str]:
    """Wait for the submitter to end, releasing the job whenever it waits to be started again
    after a requeue (SLURM holds it ~2 minutes: a harness action, theseus does not rely on it)."""
    deadline, released = time.time() + timeout, []
    while proc.poll() is None:
        assert time.time() < deadline, f"job {job} did not end in {timeout} s"
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%t %r"], capture_output=True, text=True).stdout
        if state.split() == ["PD", "BeginTime"]:
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
            released.append(state)
        time.sleep(2)
    return released


def summary(sweep_dir: Path) -> dict[str, str]:
    with (sweep_dir / "summary.csv").open() as f:
        (row,) = csv.DictReader(f)
    return row


@pytest.mark.parametrize(("launcher", "refused"), [
    ({"timeout_min": 2, "signal_delay_s": 30}, False),  # 120 s = 30 + 30 + 60: the tests' limit
    ({"timeout_min": 2, "signal_delay_s": 31}, True),
    ({"timeout_min": 2, "signal_delay_s": 60}, True),  # theseus's delay needs 3 minutes
    ({"timeout_min": 3, "signal_delay_s": 60}, False),
])
def test_the_shortest_time_limit_leaves_the_warning_a_compile_and_a_save(launcher, refused):
    config = OmegaConf.create({"_target_": "hydra_plugins.theseus_slurm.launcher.SlurmLauncher", **launcher})
    if refused:
        with pytest.raises(ConfigError, match=r"leaves no time to train"):
            check_time_limit(config)
    else:
        check_time_limit(config)
    check_time_limit(OmegaConf.create({"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}))


@pytest.mark.slow
def test_a_time_limit_too_short_for_its_warning_is_refused_before_submitting(tmp_path, corpus):
    proc = subprocess.run([sys.executable, "-m", "theseus.run", "-m", "+experiment=gpt_tiny", "hydra/launcher=slurm",
                           "hydra.launcher.timeout_min=2", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "theseus: error: hydra.launcher.timeout_min=2 (120 s) leaves no time to train: SLURM warns up to 90 s before "
        "the limit (hydra.launcher.signal_delay_s=60, checked every 30 s) and a segment needs about 60 s to compile "
        "and save: give hydra.launcher.timeout_min>=3 or a smaller signal_delay_s"]
    assert not (tmp_path / "sweep").exists()


def steps_for(seconds: float, corpus: Path, tmp_path: Path) -> int:
    """gpt_tiny's steps in ``seconds`` on this machine now, from a short local run of the same
    job (its last logged tokens/s): this machine runs it anywhere between ~12 and ~80 steps/s."""
    run_dir = tmp_path / "calibration"
    subprocess.run([sys.executable, "-m", "theseus.run", "+experiment=gpt_tiny", "data.source=text",
                    f"data.path={corpus}", f"data.cache_dir={corpus.parent / 'cache'}", "trainer.max_steps=400",
                    "trainer.log_every=100", "trainer.eval_every=0", "trainer.eval_batches=1", "logger.mode=disabled",
                    f"hydra.run.dir={run_dir}"], check=True, capture_output=True, env=env())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    per_step = cfg.trainer.batch_size * cfg.architecture.seq_len  # tokens
    return int(seconds * [row["tokens_per_s"] for row in rows if "tokens_per_s" in row][-1] / per_step)


@pytest.mark.slow
def test_a_time_limit_saves_at_the_warning_requeues_and_finishes(slurm, tmp_path, corpus):
    """More steps than one 2-minute segment takes (the warning ~90 s in), measured on this
    machine as it is loaded now, so at least one warning arrives."""
    steps = steps_for(150, corpus, tmp_path)  # more than one segment (~90 s of steps), about two
    sweep_dir = tmp_path / "sweep"
    proc = sweep(corpus, sweep_dir, f"trainer.max_steps={steps}", "trainer.log_every=10", "hydra.launcher.timeout_min=2",
                 "hydra.launcher.signal_delay_s=30")
    job = job_id(sweep_dir)
    released = follow(proc, job, timeout=1200)
    output = Path(f"{sweep_dir}.log").read_text()
    assert proc.returncode == 0, output[-3000:]
    log = (sweep_dir / "0" / "run.log").read_text()  # every segment's
    stops = [int(s) for s in re.findall(r"theseus: SIGUSR2 received: stopping after step (\d+): saving", log)]
    resumes = [int(s) for s in re.findall(r"resuming from \S+/checkpoints/(\d+) at step \d+", log)]
    assert stops and resumes == stops and len(released) == len(stops), log[-3000:]  # each segment: the last one's
    for step in stops:
        assert f"interrupted by SIGUSR2 after step {step}/{steps}; checkpoint {step} saved" in log
    assert log.count(f"theseus: requeued SLURM job {job}") == len(stops)
    assert f"complete: step {steps}/{steps}" in log and "Traceback" not in output
    row = summary(sweep_dir)
    assert (row["status"], row["resumable"]) == ("ok", "False") and float(row["val_loss"]) > 0


@pytest.mark.slow
def test_scancel_of_two_tasks_saves_the_step_they_agree_on_and_the_printed_resume_finishes(slurm, tmp_path, corpus):
    """scancel signals every process of the job (W&B's service too, offline by default): the two
    processes agree on the stop step every step, not at log steps (none is reached here), and
    save it well inside SLURM's 30 s KillWait; the job is a ``preempted``, resumable row whose
    printed resume command finishes it, on SLURM, from that checkpoint."""
    sweep_dir = tmp_path / "sweep"
    proc = sweep(corpus, sweep_dir, "trainer.max_steps=120", "trainer.log_every=1000", "trainer.checkpoint_every=20",
                 "hydra.launcher.tasks_per_node=2")
    job = job_id(sweep_dir)
    deadline = time.time() + 240
    while not (sweep_dir / "0" / "checkpoints" / "20").is_dir():
        assert time.time() < deadline and proc.poll() is None, Path(f"{sweep_dir}.log").read_text()[-3000:]
        time.sleep(0.5)
    subprocess.run(["scancel", job], check=True)
    follow(proc, job, timeout=120)
    output = Path(f"{sweep_dir}.log").read_text()
    assert proc.returncode == 1 and "Traceback" not in output, output[-3000:]
    assert re.search(rf"job 0 preempted: SLURM job {job} ended CANCELLED[^(]*\(resumable; see {sweep_dir}/0/run.log\)",
                     output), output[-3000:]
    run_log = sweep_dir / "0" / "run.log"
    log = run_log.read_text()
    (stop,) = map(int, re.findall(r"interrupted by SIGTERM after step (\d+)/120; checkpoint \d+ saved", log))
    (acknowledged,) = map(int, re.findall(r"theseus: SIGTERM received: stopping after step (\d+)", log))  # process 0's
    assert acknowledged - 2 <= stop <= acknowledged, log[-3000:]  # the other's signal may have come a step earlier
    assert (sweep_dir / "0" / "checkpoints" / str(stop)).is_dir() and "Traceback" not in log
    row = summary(sweep_dir)
    assert (row["status"], row["resumable"]) == ("preempted", "True")

    (resume,) = re.findall(r"resume:\s+(.+)", log)
    assert resume.startswith("python -m theseus.run -m ") and ".submitit" not in resume, resume
    again = subprocess.run(shlex.split(resume.replace("python", sys.executable, 1)), capture_output=True, text=True,
                           env=env(), cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    log = run_log.read_text()
    assert f"resuming from {sweep_dir}/0/checkpoints/{stop} at step {stop}" in log and "complete: step 120/120" in log
    assert summary(sweep_dir)["status"] == "ok"
