"""A run's life as a researcher lives it, from the command line in a folder of their own:
start, Ctrl-C, Ctrl-C twice, the same command again, a longer run, a new run from a checkpoint
with another learning rate; the W&B segments of the resumed run read back as one run."""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

STEPS = 30
ACK = "received: stopping after step"


def base(corpus: Path) -> list[str]:
    """The command a user repeats (default run directories: outputs/DATE/TIME)."""
    return ["+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}", f"data.cache_dir={corpus.parent / 'c'}",
            f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.eval_every=10", "trainer.eval_batches=1",
            "trainer.checkpoint_every=10", "optimizer.schedule=constant", "optimizer.warmup_steps=0"]


def env() -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def theseus(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "theseus.run", *args], capture_output=True, text=True, env=env(),
                          cwd=cwd, timeout=300)


def interrupted(cwd: Path, args: list[str], twice: bool = False) -> tuple[subprocess.Popen, str, float, float]:
    """Start a run and send SIGINT after its first logged step, and with ``twice`` again once
    it is acknowledged; returns the process, its output, the seconds from the signal to its
    acknowledgement and from the last signal to the exit."""
    proc = subprocess.Popen([sys.executable, "-u", "-m", "theseus.run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env(), cwd=cwd)
    lines, sent, acked = [], None, None
    for line in proc.stdout:
        lines.append(line)
        if sent is None and line.startswith("step "):
            sent = time.monotonic()
            os.kill(proc.pid, signal.SIGINT)
        if acked is None and ACK in line:
            acked = time.monotonic() - sent
            if twice:
                sent = time.monotonic()
                os.kill(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    return proc, "".join(lines), acked, time.monotonic() - sent


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def checkpoints(run_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())


def wandb_records(path: Path) -> list:
    """The records of an offline ``.wandb`` file: W&B's LevelDB-style log (7-byte header,
    32 KiB blocks of chunks: crc32, length, type FULL=1/FIRST=2/MIDDLE=3/LAST=4)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, chunks, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # block padding
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        chunks = chunk if kind in (1, 2) else chunks + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
    return records


@pytest.mark.slow
def test_start_stop_continue(corpus, tmp_path):
    cmd = base(corpus)

    # start; Ctrl-C after the first logged step: acknowledged at once, stopped after a step, saved
    first, out, acked, _ = interrupted(tmp_path, cmd)
    assert first.returncode == 128 + signal.SIGINT, out[-3000:]
    assert acked is not None and acked < 2.0, out[-3000:]
    [run_dir] = [p.parent.parent for p in (tmp_path / "outputs").glob("*/*/.hydra/config.yaml")]
    assert f"theseus: run directory {run_dir}\n" in out
    stopped = int(out.split(ACK, 1)[1].split(":")[0])
    assert checkpoints(run_dir) == [stopped] and stopped < STEPS
    assert f"interrupted by SIGINT after step {stopped}/{STEPS}; checkpoint {stopped} saved" in out
    [resume] = [line.split("resume:", 1)[1].strip() for line in out.splitlines() if "resume:" in line]
    assert resume == "python -m theseus.run " + " ".join(cmd) + " trainer.resume=last"
    assert (run_dir / "run.log").read_text().count(ACK) == 1  # the transcript holds what the console showed

    # the printed command, Ctrl-C twice: the second exits at once, before the summary
    again = shlex.split(resume)[3:]
    twice, out, _, exited = interrupted(tmp_path, again, twice=True)
    assert twice.returncode == 128 + signal.SIGINT, out[-3000:]
    assert out.rstrip().endswith("theseus: SIGINT again: exiting now, without saving"), out[-3000:]
    assert exited < 2.0 and checkpoints(run_dir)[0] == stopped

    # the printed command once more: resumes in the same directory and finishes
    done = theseus(tmp_path, *again)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {run_dir / 'checkpoints' / str(stopped)} at step {stopped}" in done.stderr
    assert f"eval step {STEPS}: val_loss " in done.stdout + done.stderr
    rows = metrics(run_dir)
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, STEPS + 1))  # each step once
    assert len(list((tmp_path / "outputs").glob("*/*/.hydra"))) == 1

    # longer: a constant schedule extends in place
    longer = theseus(tmp_path, *again, f"trainer.max_steps={STEPS + 10}")
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert [r["step"] for r in metrics(run_dir) if "loss" in r] == list(range(1, STEPS + 11))
    # a new run from step 20's weights, with a lower learning rate and a cosine schedule
    new_dir = tmp_path / "lower-lr"
    source = run_dir / "checkpoints" / "20"
    new_run = [*cmd, f"trainer.init_from={source}", "optimizer.lr=1e-3", "optimizer.schedule=cosine",
               f"hydra.run.dir={new_dir}"]
    init = theseus(tmp_path, *new_run, "trainer.max_steps=3", "trainer.profile_steps=[2,3]")
    assert init.returncode == 0, init.stderr[-3000:]
    assert f"starting from the weights of {source}" in init.stderr
    assert f"profile of steps 2-3 written to {new_dir / 'profile'}" in init.stderr
    new = [r for r in metrics(new_dir) if "loss" in r]
    assert [r["step"] for r in new] == [1, 2, 3]
    assert new[0]["lr"] == pytest.approx(1e-3) and new[2]["lr"] < 1e-3  # lr of step 1: the cosine's start
    trained = next(r["loss"] for r in metrics(run_dir) if r["step"] == 20 and "loss" in r)
    assert new[0]["loss"] < trained + 0.3 < 5.0  # a fresh model's loss is about ln(256) = 5.5
    # another optimizer takes the weights alone; its state, or weights of other shapes, are refused in one line
    lion = theseus(tmp_path, *new_run, "trainer.max_steps=1", "optimizer=lion", f"hydra.run.dir={tmp_path / 'lion'}")
    assert lion.returncode == 0 and f"starting from the weights of {source}" in lion.stderr, lion.stderr[-3000:]
    for change, problem in (["optimizer=lion", "trainer.init_optimizer=true"], "its optimizer is adamw, this run's is "
                            "lion: drop trainer.init_optimizer or use optimizer=adamw"), (["architecture.n_heads=2"], (
                            "parameter h_0/attn/bk is (2, 32) in this run but is (4, 16) there: start from a run of "
                            "the same architecture (or drop the architecture.* overrides)")):
        for dry in ([], ["trainer.dry_run=true"]):  # a dry run (assembled without its folder) says the same
            refused = theseus(tmp_path, *new_run, *change, *dry, f"hydra.run.dir={tmp_path / 'refused'}")
            assert refused.stderr.splitlines() == [f"theseus: error: trainer.init_from={source}: {problem}"]
            assert refused.returncode == 2 and not (tmp_path / "refused").exists()

    # extending its cosine would change the learning rates already used: refused, saying what works
    cosine = theseus(tmp_path, *new_run, "trainer.max_steps=6")
    assert cosine.returncode == 2
    floor = OmegaConf.load(new_dir / ".hydra" / "config.yaml").optimizer.min_lr_ratio
    longer_lr = 1e-3 * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * 1 / 6)))  # step 2 of a 6-step cosine
    assert cosine.stderr.splitlines() == [
        f"theseus: error: cannot continue {new_dir} to trainer.max_steps=6: with optimizer.schedule=cosine the "
        f"learning rate of step 2 (of the 3 taken) would have been {longer_lr:.3g}, not "
        f"{new[1]['lr']:.3g}. Start a new run from its weights instead: trainer.init_from={new_dir} "
        "trainer.max_steps=6 hydra.run.dir=NEW (trainer.init_optimizer=true keeps its optimizer state); a "
        "constant or wsd schedule can be extended in place"]

    # W&B: one segment per session, one run id, the steps of every session
    segments = sorted((run_dir / "wandb").glob("offline-run-*/*.wandb"))
    ids, steps = set(), set()
    for segment in segments:
        for record in wandb_records(segment):
            kind = record.WhichOneof("record_type")
            ids |= {record.run.run_id} if kind == "run" else set()
            steps |= {record.history.step.num} if kind == "history" else set()
    assert len(segments) >= 3 and len(ids) == 1
    assert steps >= set(range(1, STEPS + 11))
    sync = f"wandb sync {run_dir / 'wandb'}/offline-run-*"
    assert f"W&B:      {sync}" in longer.stdout + longer.stderr
    dry = subprocess.run(f"{Path(sys.executable).parent / 'wandb'} sync --dry-run {sync[len('wandb sync '):]}",
                         shell=True, capture_output=True, text=True, env=env(), timeout=120)
    assert dry.returncode == 0 and f"Would sync {len(segments)} run(s)" in dry.stdout + dry.stderr


@pytest.mark.slow
def test_ctrl_c_while_compiling_exits_in_one_line_writing_nothing(corpus, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-u", "-m", "theseus.run", *base(corpus), f"hydra.run.dir={run_dir}"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp_path,
                            env={**env(), "JAX_LOG_COMPILES": "1", "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax")})
    lines = []
    for line in proc.stderr:  # JAX logs each compilation: the preflight's build is under way
        lines.append(line)
        if "Compiling " in line:
            os.kill(proc.pid, signal.SIGINT)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGINT, "".join(lines) + rest
    assert rest.strip().splitlines()[-1:] == ["theseus: interrupted by SIGINT before the first step: nothing saved"], rest
    assert "Traceback" not in rest and not run_dir.exists()
