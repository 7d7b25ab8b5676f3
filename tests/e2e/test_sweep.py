"""Sweeps: the summary of a multirun (with a failing point), the shipped sweep files, launchers."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from support import ROOT, run_python, wandb_records

from theseus.cli.sweep import RESULT, Job, SweepSummary, error_line, swept
from theseus.config.compose import compose

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

APP = str(ROOT / "tests" / "sweep_app.py")  # fake training: val_loss is least at lr=3e-3; lr >= 0.1 raises


def sweep(tmp_path: Path, *overrides: str):
    """Run the test app as ``-m OVERRIDES``; returns the process, the summary rows and document."""
    result = run_python(APP, "-m", f"hydra.sweep.dir={tmp_path}", *overrides, cwd=tmp_path, timeout=120)
    with (tmp_path / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    return result, rows, json.loads((tmp_path / "summary.json").read_text())


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_failing_point_is_recorded_and_the_others_finish(tmp_path, launcher):
    result, rows, summary = sweep(tmp_path, "optimizer.lr=0.001,0.2,0.003", f"hydra/launcher={launcher}")
    assert result.returncode != 0  # Hydra re-raises the failure once every job has run
    assert [(row["job"], row["optimizer.lr"], row["status"]) for row in rows] == [
        ("0", "0.001", "ok"), ("1", "0.2", "failed"), ("2", "0.003", "ok")]
    assert rows[1]["error"] == "FloatingPointError: loss is nan at step 20" and rows[1]["val_loss"] == ""
    assert float(rows[2]["val_loss"]) == 2.0 < float(rows[0]["val_loss"])
    assert float(rows[0]["tokens_per_s"]) == 1020.0 and float(rows[0]["mfu"]) == 0.01
    assert summary["swept"] == ["optimizer.lr"]
    assert [job["status"] for job in summary["jobs"]] == ["ok", "failed", "ok"]
    assert json.loads((tmp_path / "2" / RESULT).read_text())["status"] == "ok"
    assert "sweep: 3 jobs, 1 failed" in result.stdout
    assert "job 1 failed: FloatingPointError: loss is nan at step 20" in result.stdout


def test_lr_grid_runs_every_point(tmp_path):
    result, rows, _ = sweep(tmp_path, "+sweep=lr")
    assert result.returncode == 0, result.stderr
    assert [float(row["optimizer.lr"]) for row in rows] == [1e-4, 3e-4, 1e-3, 3e-3]
    assert {row["status"] for row in rows} == {"ok"}
    assert "sweep: 4 jobs, 0 failed" in result.stdout


def test_optuna_minimises_the_returned_val_loss(tmp_path):
    result, rows, summary = sweep(tmp_path, "+sweep=lr_optuna")
    assert result.returncode == 0, result.stderr
    shown = result.stdout + result.stderr  # off a terminal: no colour codes, no launch line per trial
    assert "\x1b[" not in shown and "Launching" not in shown, shown
    announced = f"sweep into {tmp_path}: a line per job as it ends, each job's whole console in its run.log\n"
    assert shown.count(announced) == 1
    assert "] A new study created in memory with name: lr\n" in shown
    assert len(rows) == 8 and {row["status"] for row in rows} == {"ok"}
    assert all(1e-4 <= job["params"]["optimizer.lr"] <= 1e-2 for job in summary["jobs"])
    best = OmegaConf.load(tmp_path / "optimization_results.yaml")
    assert best.best_value == min(job["val_loss"] for job in summary["jobs"])


def test_seed_groups_give_mean_interval_and_welch_p(tmp_path):
    """Sweeping +trainer.seed beside optimizer.lr: one group per lr, checked against scipy."""
    import numpy as np
    from scipy import stats

    from sweep_app import val_loss

    result, rows, summary = sweep(tmp_path, "optimizer.lr=0.001,0.003", "+trainer.seed=0,1,2", "+logger.mode=offline")
    assert result.returncode == 0, result.stderr
    assert len(rows) == 6
    header = next(line for line in result.stdout.splitlines() if "┃ job" in line)  # wider than 80 columns: whole
    assert [name.strip() for name in header.strip("┃ ").split("┃")] == list(rows[0])[:-1], header  # less error
    finals = {lr: [val_loss(lr, seed) for seed in (0, 1, 2)] for lr in (0.001, 0.003)}
    best, other = summary["seed_groups"]
    assert best["params"] == {"optimizer.lr": 0.003} and other["params"] == {"optimizer.lr": 0.001}
    for group, lr in ((best, 0.003), (other, 0.001)):
        low, high = stats.t.interval(0.95, 2, loc=np.mean(finals[lr]), scale=stats.sem(finals[lr]))
        assert group["n"] == 3 and group["mean"] == pytest.approx(np.mean(finals[lr]), rel=1e-12)
        assert group["ci"] == pytest.approx((high - low) / 2, rel=1e-9)
    test = stats.ttest_ind(finals[0.003], finals[0.001], equal_var=False, alternative="less")
    assert other["p"] == pytest.approx(test.pvalue, rel=1e-9) and best["p"] is None
    assert "seed groups: val_loss mean +- 95% interval" in result.stdout
    for group in (best, other):
        assert f"{group['mean']:.4f} +- {group['ci']:.4f} (n=3)" in result.stdout
    assert f"{test.pvalue:.2g}" in result.stdout

    # W&B: a run in the sweep's group with the groups in its summary
    (log,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(log)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.run_group, run.job_type) == (str(tmp_path), "seed-groups")
    summary = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for r in records
               if r.WhichOneof("record_type") == "summary" for item in r.summary.update}
    assert summary["seed_groups/optimizer.lr=0.001/mean"] == pytest.approx(np.mean(finals[0.001]))
    assert summary["seed_groups/optimizer.lr=0.001/p"] == pytest.approx(test.pvalue)
    assert summary["seed_groups/optimizer.lr=0.003/n"] == 3


def test_a_single_seed_sweep_says_so(tmp_path):
    result, _, summary = sweep(tmp_path, "optimizer.lr=0.001,0.003")
    assert result.returncode == 0, result.stderr
    assert "single seed: each setting ran once" in result.stdout
    assert [group["ci"] for group in summary["seed_groups"]] == [None, None]


def test_sweep_files_and_launchers_compose():
    grid = compose(["+sweep=lr"], hydra=True).hydra
    assert grid.sweeper.params["optimizer.lr"] == "1e-4,3e-4,1e-3,3e-3"
    optuna = compose(["+sweep=lr_optuna"], hydra=True).hydra
    assert optuna.sweeper._target_.endswith("OptunaSweeper") and optuna.sweeper.direction == "minimize"
    assert optuna.sweeper.sampler._target_ == "optuna.samplers.TPESampler"
    assert optuna.sweeper.params["optimizer.lr"] == "tag(log, interval(1e-4, 1e-2))"
    assert isinstance(instantiate(optuna.callbacks.sweep_summary), SweepSummary)
    assert compose(["hydra/launcher=joblib"], hydra=True).hydra.launcher._target_.endswith("JoblibLauncher")
    assert compose(["hydra/launcher=submitit_slurm"], hydra=True).hydra.launcher._target_.endswith("SlurmLauncher")


def test_swept_keys_are_those_that_vary():
    def job(**params):
        return Job("0", params, "ok", "", None, None, None)

    assert swept([job(experiment="a", lr=1e-3), job(experiment="a", lr=3e-3)]) == ["lr"]
    assert swept([job(experiment="a", lr=1e-3)]) == ["experiment", "lr"]
    assert error_line(RuntimeError("first line\nsecond")) == "RuntimeError: first line"
    assert error_line(KeyError()) == "KeyError"
