"""RunLogger: metrics.jsonl, the offline W&B run and its config, secrets kept out."""

from __future__ import annotations

import json
import subprocess

import jax.numpy as jnp
import numpy as np
import pytest

from support import run_python, wandb_records
from theseus.training.logger import REDACTED, LoggerConfig, RunLogger, scrub, secrets

KEYS = ["loss", "lr", "grad_norm", "step_time", "tokens_per_s", "flops_per_s", "mfu", "data_wait"]


def _metrics(step: int) -> dict:
    values = {key: 0.5 + step + i for i, key in enumerate(KEYS)}
    values["loss"] = jnp.float32(2.5)  # a JAX scalar
    values["mfu"] = np.float64(0.25)  # a numpy scalar
    return values


def _read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_jsonl_has_every_key_and_appends_across_loggers(tmp_path, capsys):
    config = LoggerConfig(mode="disabled")
    with RunLogger(config, tmp_path, resolved_config={}, total_steps=4) as logger:
        logger.log(1, _metrics(1))
        logger.log(2, {**_metrics(2), "val_loss": float("nan")})
        logger.log(3, {"loss": 9.0})  # after the checkpoint at step 2: replaced on resume
        logger.summary(params=1234, device_kind="cpu")
    with open(tmp_path / "metrics.jsonl", "a") as file:
        file.write('{"step": 4, "lo')  # a line cut short by a crash
    with RunLogger(config, tmp_path, resolved_config={}, total_steps=4, start_step=2) as logger:
        logger.log(3, _metrics(3))
        with pytest.raises(ValueError, match="'loss' must be a scalar"):
            logger.log(4, {"loss": np.ones(2)})

    rows = _read(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(set(KEYS) <= set(row) for row in rows)
    assert rows[0]["loss"] == 2.5 and rows[0]["mfu"] == 0.25 and rows[2]["lr"] == 4.5
    assert rows[1]["val_loss"] is None  # not finite: null keeps the line strict JSON
    assert not (tmp_path / "wandb").exists()
    out = capsys.readouterr().out
    assert "step 3/4 loss 2.5 tok/s 7.5 mfu 25.0%" in out and "summary" not in out  # the trainer's table says it


def test_only_the_main_process_writes(tmp_path, capsys):
    run_dir = tmp_path / "run"
    with RunLogger(LoggerConfig(), run_dir, resolved_config={}, total_steps=2, is_main=False) as logger:
        logger.log(1, {"loss": 1.0})
        logger.summary(params=1)
        logger.message("hello")
    assert not run_dir.exists()
    assert capsys.readouterr().out == ""


def test_scrub_hides_environment_secrets():
    env = {"WANDB_API_KEY": "k" * 40, "HF_TOKEN": "hf_abcdefgh", "DB_PASSWORD": "pw", "HOME": "/home/me"}
    hidden = secrets(env)
    assert hidden[0] == "k" * 40 and set(hidden) == {"k" * 40, "hf_abcdefgh", "pw"}
    config = {"a": {"key": "k" * 40, "url": "https://x:hf_abcdefgh@host", "home": "/home/me"}, "b": ["pw", "pwd", 3]}
    assert scrub(config, hidden) == {
        "a": {"key": REDACTED, "url": f"https://x:{REDACTED}@host", "home": "/home/me"},
        "b": [REDACTED, "pwd", 3],  # a short secret is hidden only where it is the whole value
    }


@pytest.mark.slow
def test_offline_wandb_run_holds_the_config_and_no_secret(tmp_path, monkeypatch):
    api_key, token = "0123456789abcdef" * 2 + "01234567", "tok-secret-value-42"
    monkeypatch.setenv("WANDB_API_KEY", api_key)
    monkeypatch.setenv("MY_SERVICE_TOKEN", token)
    resolved = {"architecture": {"n_layers": 2}, "logger": {"mode": "offline"}, "data": {"auth": token}, "k": api_key}
    config = LoggerConfig(project="tests", name="tiny", tags=["a", "b"])
    with RunLogger(config, tmp_path, resolved_config=resolved, total_steps=2) as logger:
        logger.log(1, {"loss": 3.0, "mfu": 0.1})
        logger.summary(params=10, note=f"key {api_key}")

    [run] = list((tmp_path / "wandb").glob("offline-run-*"))
    [log] = list(run.glob("run-*.wandb"))
    config_items = {}
    for record in wandb_records(log):
        items = record.run.config.update if record.HasField("run") else record.config.update
        config_items.update({item.key: json.loads(item.value_json) for item in items})
    assert config_items["architecture"] == {"n_layers": 2}
    assert config_items["data"] == {"auth": REDACTED} and config_items["k"] == REDACTED

    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert api_key.encode() not in data and token.encode() not in data, path


def _run_record(log):
    return next(record.run for record in wandb_records(log) if record.WhichOneof("record_type") == "run")


def _history_keys(log) -> set[str]:
    return {key for record in wandb_records(log) if record.WhichOneof("record_type") == "history"
            for item in record.history.item for key in (item.key, *item.nested_key) if key and key[0] != "_"}


def test_a_resumed_run_continues_its_wandb_run_with_sectioned_metrics(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a git repository: no commit recorded
    config = LoggerConfig(project="tests")
    with RunLogger(config, tmp_path, resolved_config={}, total_steps=4) as logger:
        logger.log(1, {"loss": 3.0, "lr": 1e-3, "grad_norm": 0.5, "mfu": 0.1, "tokens_per_s": 10.0})
        logger.log(2, {"val_loss": 2.9})
    with RunLogger(config, tmp_path, resolved_config={}, total_steps=4, start_step=2) as logger:
        logger.log(3, {"loss": 2.0})
    first, second = sorted((tmp_path / "wandb").glob("offline-run-*"))
    run_id = (tmp_path / "wandb" / "run_id").read_text().strip()
    assert f"-{run_id}" in first.name and f"-{run_id}" in second.name  # W&B adds -1 to a second in one second
    records = [_run_record(next(run.glob("run-*.wandb"))) for run in (first, second)]
    assert [r.run_id for r in records] == [run_id, run_id] and records[1].resume
    assert all(r.job_type == "train" and not r.run_group and not r.git.commit for r in records)
    assert _history_keys(next(first.glob("run-*.wandb"))) == {
        "train/loss", "optim/lr", "optim/grad_norm", "throughput/mfu", "throughput/tokens_per_s", "val/loss"}
    assert [set(row) - {"step"} for row in _read(tmp_path / "metrics.jsonl")] == [  # flat names stay
        {"loss", "lr", "grad_norm", "mfu", "tokens_per_s"}, {"val_loss"}, {"loss"}]


def test_the_git_commit_of_the_working_directory_is_recorded(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run([*git, *args], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    monkeypatch.chdir(repo)
    with RunLogger(LoggerConfig(), tmp_path / "run", resolved_config={}, total_steps=1) as logger:
        logger.log(1, {"loss": 1.0})
    [log] = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    assert _run_record(log).git.commit == commit


@pytest.mark.slow
def test_sweep_jobs_share_a_wandb_group_and_job_type(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(open(json.__file__, encoding="utf-8").read() * 4)
    sweep = tmp_path / "sweep"
    proc = run_python("-m", "theseus.run", "-m", "+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}",
                      f"data.cache_dir={tmp_path / 'cache'}", "trainer.max_steps=2", "trainer.eval_every=0",
                      "trainer.checkpoint_every=0", "optimizer.lr=1e-3,2e-3", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [_run_record(log) for log in sorted(sweep.glob("*/wandb/offline-run-*/run-*.wandb"))]
    assert len(records) == 2 and records[0].run_id != records[1].run_id
    assert {(r.run_group, r.job_type) for r in records} == {(str(sweep), "sweep")}


def test_a_run_outlives_wandbs_service_signalled_with_its_job(tmp_path, capsys):
    """scancel and time limits signal every process of a job, W&B's service too: the run goes on
    without W&B, saying so once, and closes without an error (the trainer's ``interrupted``)."""
    import os
    import signal

    with RunLogger(LoggerConfig(), tmp_path, resolved_config={}, total_steps=3) as logger:
        logger.log(1, {"loss": 3.0})
        services = subprocess.run(["pgrep", "-P", str(os.getpid()), "wandb-core"], capture_output=True,
                                  text=True).stdout.split()
        assert services
        for pid in services:
            os.kill(int(pid), signal.SIGTERM)
            os.waitpid(int(pid), 0)
        logger.log(2, {"loss": 2.0})
        logger.summary(status="interrupted")
    said = capsys.readouterr()
    lines = [line for line in (said.out + said.err).splitlines() if "W&B's service has stopped" in line]
    assert lines == [f"theseus: W&B's service has stopped (ConnectionResetError: Connection lost), signalled with "
                     f"the job: the run goes on without W&B; {tmp_path / 'wandb'} keeps what it had written"]
    assert [row["step"] for row in _read(tmp_path / "metrics.jsonl")] == [1, 2]
    assert not (tmp_path / "result.json").exists()  # not failed
