"""``trainer.resume=last`` as the README's reader meets it, in one folder: a run of another
command with its own ``hydra.run.dir`` is left alone; Ctrl-C; the same command without
``resume=last`` names the unfinished run and the command that continues it, and is stopped in
its turn, two steps in; that printed command continues the furthest run (not the newest),
saying which run and step, and names the other with the command that continues it, which does;
run once more, the complete run trains nothing and opens no new W&B segment."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

STEPS = 20


def command(corpus: Path) -> list[str]:
    """The command the reader repeats (Hydra's default run folders: outputs/DATE/TIME)."""
    return ["+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}", f"data.cache_dir={corpus.parent / 'c'}",
            f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.eval_every=0", "trainer.checkpoint_every=10"]


def env() -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def theseus(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "theseus.run", *args], capture_output=True, text=True, env=env(),
                          cwd=cwd, timeout=300)


def interrupt(cwd: Path, args: list[str], when: str) -> tuple[int, str]:
    """Run ``theseus.run ARGS`` and send it SIGINT at the first line starting with ``when``;
    returns its exit code and output."""
    proc = subprocess.Popen([sys.executable, "-u", "-m", "theseus.run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env(), cwd=cwd)
    lines, sent = [], False
    for line in proc.stdout:
        lines.append(line)
        if not sent and line.startswith(when):
            os.kill(proc.pid, signal.SIGINT)
            sent = True
    return proc.wait(timeout=60), "".join(lines)


def steps(run_dir: Path) -> list[int]:
    return [row["step"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in row]


def segments(run_dir: Path) -> tuple[list[str], str]:
    """The W&B offline runs of ``run_dir`` and the one ``latest-run`` points at."""
    wandb = run_dir / "wandb"
    return sorted(p.name for p in wandb.glob("offline-run-*")), os.readlink(wandb / "latest-run")


def test_resume_last_continues_only_what_this_command_started(corpus, tmp_path):
    cmd = command(corpus)
    # another command's run, with its own hydra.run.dir (the README's lm-eval section), complete
    own = theseus(tmp_path, *cmd, "trainer.max_steps=10", "logger.mode=disabled", "hydra.run.dir=outputs/own")
    assert own.returncode == 0, own.stderr[-3000:]

    # this command, with resume=last: none of its own yet; Ctrl-C after step 12
    code, out = interrupt(tmp_path, [*cmd, "trainer.resume=last"], when="step 12/")
    assert code == 128 + signal.SIGINT, out[-3000:]
    assert "theseus: trainer.resume=last: no run under outputs/ that this command started; starting a new one" in out
    [run_dir] = [p.parent.parent.relative_to(tmp_path) for p in (tmp_path / "outputs").glob("*/*/.hydra/overrides.yaml")]
    stopped = int(out.split("received: stopping after step ", 1)[1].split(":")[0])
    assert 12 <= stopped < STEPS, out[-3000:]

    # the same command without resume=last: a new run, naming the unfinished one and its command;
    # Ctrl-C after its first step
    code, out = interrupt(tmp_path, cmd, when="step 1/")
    continues = shlex.join(["python", "-m", "theseus.run", *cmd, "trainer.resume=last"])
    assert (f"theseus: a new run; {run_dir}, which this command started, stopped at step {stopped} of {STEPS}: "
            f"to continue it instead, run {continues}\n") in out, out[-3000:]
    assert code == 128 + signal.SIGINT, out[-3000:]
    [newer] = [p.parent.parent.relative_to(tmp_path) for p in (tmp_path / "outputs").glob("*/*/.hydra/overrides.yaml")
               if p.parent.parent.relative_to(tmp_path) != run_dir]
    early = int(out.split("received: stopping after step ", 1)[1].split(":")[0])
    assert early < stopped, out[-3000:]

    # the printed command continues the furthest run (not the newest, nor outputs/own), saying so,
    # and prints the command that continues the other
    printed = shlex.split(continues)
    done = subprocess.run([sys.executable, *printed[1:]], capture_output=True, text=True, env=env(), cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    other = shlex.join(["python", "-m", "theseus.run", *cmd, f"hydra.run.dir={newer}"])
    assert (f"theseus: trainer.resume=last: resuming {run_dir} at step {stopped} of {STEPS}, the furthest of the "
            f"runs this command left unfinished (also {newer} at step {early}: to continue that one instead, run "
            f"{other})\n") in done.stderr, done.stderr[-3000:]
    assert f"complete: step {STEPS}/{STEPS}" in done.stdout + done.stderr
    assert steps(tmp_path / run_dir) == list(range(1, STEPS + 1))
    assert steps(tmp_path / "outputs" / "own") == list(range(1, 11))  # untouched
    finished = subprocess.run([sys.executable, *shlex.split(other)[1:]], capture_output=True, text=True, env=env(),
                              cwd=tmp_path, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert f"resuming from {tmp_path / newer / 'checkpoints' / str(early)} at step {early}" in finished.stderr
    assert steps(tmp_path / newer) == list(range(1, STEPS + 1))

    # once more: complete, nothing to train, and no new W&B segment for latest-run to point at
    before = segments(tmp_path / run_dir)
    again = subprocess.run([sys.executable, *printed[1:]], capture_output=True, text=True, env=env(), cwd=tmp_path,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{run_dir} is complete at step {STEPS}: nothing to train" in again.stdout + again.stderr
    assert segments(tmp_path / run_dir) == before and len(before[0]) == 2


def test_a_sweep_jobs_printed_resume_is_its_own_single_run(corpus, tmp_path):
    """Ctrl-C in a sweep's first job (its output piped: its line says where the resume command
    is): its resume command has the job's own value, not the sweep's list, no -m, its folder as
    hydra.run.dir; run, it finishes that job there."""
    cmd = [*command(corpus), "logger.mode=disabled"]
    job = tmp_path / "sweep" / "0"
    proc = subprocess.Popen([sys.executable, "-m", "theseus.run", "-m", *cmd, "optimizer.lr=1e-3,3e-3",
                             "hydra.sweep.dir=sweep"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env(), cwd=tmp_path)
    while not ((job / "metrics.jsonl").is_file() and (job / "metrics.jsonl").read_text()):  # its first step
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGINT, out[-3000:]
    assert ": interrupted by SIGINT: its run.log ends with the command that resumes it (" in out, out[-3000:]
    (resume,) = [line.split("resume:", 1)[1].strip() for line in (job / "run.log").read_text().splitlines()
                 if "resume:" in line]
    assert resume == shlex.join(["python", "-m", "theseus.run", *cmd, "optimizer.lr=0.001", f"hydra.run.dir={job}"])
    stopped = max(int(p.name) for p in (job / "checkpoints").iterdir())
    done = subprocess.run([sys.executable, *shlex.split(resume)[1:]], capture_output=True, text=True, env=env(),
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {job / 'checkpoints' / str(stopped)} at step {stopped}" in done.stderr
    assert steps(job) == list(range(1, STEPS + 1)) and not (tmp_path / "sweep" / "1").exists()
