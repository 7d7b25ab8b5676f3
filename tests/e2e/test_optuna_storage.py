"""A persistent Optuna study: ``hydra.sweeper.storage=sqlite:///...``, run twice, continues.

optuna 2.10 (what hydra-optuna-sweeper accepts) needs SQLAlchemy 1.4 and an Alembic of its
time (pyproject.toml pins both); with SQLAlchemy 2 its SQLite storage fails on an assertion.
"""

from __future__ import annotations

import optuna
import pytest
from omegaconf import OmegaConf
from support import ROOT, run_python

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

APP = str(ROOT / "tests" / "sweep_app.py")  # fake training: val_loss is least at lr=3e-3


def test_a_second_sweep_continues_the_first_ones_study(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    for run in ("first", "second"):
        proc = run_python(APP, "-m", "+sweep=lr_optuna", "hydra.sweeper.n_trials=3", f"hydra.sweeper.storage={storage}",
                          f"hydra.sweep.dir={tmp_path / run}", cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="lr", storage=storage)
    assert [trial.number for trial in study.trials] == list(range(6))
    assert all(trial.state == optuna.trial.TrialState.COMPLETE for trial in study.trials)
    first = OmegaConf.load(tmp_path / "first" / "optimization_results.yaml").best_value
    second = OmegaConf.load(tmp_path / "second" / "optimization_results.yaml").best_value
    assert second == min(trial.value for trial in study.trials) <= first  # the best of all six trials
