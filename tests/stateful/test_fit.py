"""Model.fit (the optax loop) and the pmm_regression experiment."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from theseus.config import ConfigError, configuration
from theseus.config.compose import compose
from theseus.stateful.fit import FitSettings, History
from theseus.tasks.regression import run_regression
from theseus.stateful import AffineEigenvaluePMM, Linear, Model

RNG = np.random.default_rng(0)


@pytest.mark.slow
def test_fit_learns_least_squares():
    x = RNG.normal(size=(256, 3)).astype(np.float32)
    y = (x @ np.array([[1.0, -2.0], [0.5, 0.0], [3.0, 1.0]]) + [0.3, -1.0]).astype(np.float32)
    model = Model([Linear(width=2)])
    history = model.fit(x, y, epochs=150, lr=0.05, batch_size=32)
    assert isinstance(history, History) and history.loss[-1] < history.loss[0] / 100
    w, b = model.get_params()[0]
    design = np.c_[x, np.ones(len(x))]
    expected = np.linalg.lstsq(design, y, rcond=None)[0]
    np.testing.assert_allclose(np.r_[w, b[None]], expected, atol=2e-2)


@pytest.mark.slow
def test_a_short_fit_reduces_the_pmm_loss():
    x = RNG.normal(size=(128, 2)).astype(np.float32)
    y = np.sin(x[:, :1]) + x[:, 1:] ** 2
    model = Model([AffineEigenvaluePMM(n=3, k=2), Linear(width=1)])
    history = model.fit(x, y, epochs=15, val_fraction=0.25)
    assert len(history.val_loss) == len(history.loss) == 15
    assert history.loss[-1] < 0.7 * history.loss[0] and min(history.val_loss) < history.val_loss[0]


def test_best_validation_parameters_are_kept():
    # identical samples: the validation loss is the loss on any subset, and a large step oscillates
    x, y = np.ones((20, 1), np.float32), np.full((20, 1), 3.0, np.float32)
    model = Model([Linear(width=1)])
    history = model.fit(x, y, epochs=25, lr=1.0, batch_size=4, patience=0, val_fraction=0.2)
    best = int(np.argmin(history.val_loss))
    assert history.best_epoch == best < 24
    assert math.isclose(float(np.mean((model(x)[0] - y) ** 2)), history.val_loss[best], rel_tol=1e-5)


def test_early_stopping_waits_patience_epochs():
    x, y = np.ones((20, 1), np.float32), np.full((20, 1), 3.0, np.float32)
    history = Model([Linear(width=1)]).fit(x, y, epochs=200, lr=1.0, batch_size=4, patience=3)
    assert len(history.val_loss) == history.best_epoch + 1 + 3 < 200


def test_without_validation_the_last_parameters_are_kept():
    x = RNG.normal(size=(32, 2)).astype(np.float32)
    history = Model([Linear(width=1)]).fit(x, x[:, :1], epochs=4, val_fraction=0.0)
    assert history.val_loss == [] and history.best_epoch == 3 and len(history.loss) == 4


def test_settings_come_from_the_active_config():
    x = RNG.normal(size=(32, 2)).astype(np.float32)
    with configuration({"fit.epochs": 3, "fit.val_fraction": 0.0}):
        history = Model([Linear(width=1)]).fit(x, x[:, :1])
    assert len(history.loss) == 3


@pytest.mark.slow
def test_custom_loss_and_optimizer():
    """An L1 loss under a constant SGD step falls to a floor the step sets (2-7% of the first
    epoch's over seeds 0-5); its own data, so the order tests run in cannot move it."""
    x = np.random.default_rng(0).normal(size=(64, 1)).astype(np.float32)
    model = Model([Linear(width=1)])
    history = model.fit(x, 2 * x, loss=lambda p, t: jnp.abs(p - t).mean(), optimizer=optax.sgd(0.1), epochs=30)
    assert history.loss[-1] < 0.2 * history.loss[0]


def test_fit_errors():
    x = np.ones((10, 2), np.float32)
    with pytest.raises(ValueError, match=r"Y has per-sample shape \(\) but Model outputs \(1,\)"):
        Model([Linear(width=1)]).fit(x, np.ones(10))
    with pytest.raises(ValueError, match="X has 10 samples but Y has 9"):
        Model([Linear(width=1)]).fit(x, np.ones((9, 1)))
    with pytest.raises(ValueError, match="val_fraction=1.0 leaves none of the 10 samples to train on"):
        Model([Linear(width=1)]).fit(x, np.ones((10, 1)), val_fraction=1.0)
    with pytest.raises(TypeError, match="epoch"):
        Model([Linear(width=1)]).fit(x, np.ones((10, 1)), epoch=3)


def test_fit_settings_are_config_fields():
    cfg = compose(["+experiment=pmm_regression"])
    assert cfg.fit.epochs == FitSettings().epochs and cfg.regression.test_fraction == 0.2
    assert (cfg.architecture.pmm.n, cfg.architecture.pmm.k) == (4, 1)
    with pytest.raises(ConfigError, match="unknown config key 'fit.epoch'; did you mean fit.epochs"):
        compose(["+experiment=pmm_regression", "fit.epoch=3"])


@pytest.mark.slow
def test_pmm_regression_experiment_reports_test_mse():
    cfg = compose(["+experiment=pmm_regression", "fit.epochs=30", "architecture.pmm.n=3", "regression.mlp_hidden=8"])
    results = run_regression(cfg)
    assert set(results) == {"pmm_test_mse", "mlp_test_mse"}
    # better than predicting the mean (about 5950 on this split), in squared target units
    assert all(1000 < mse < 5000 for mse in results.values()), results


def test_without_scikit_learn_the_experiment_names_the_extra(monkeypatch):
    import sys

    from theseus.tasks.regression import diabetes

    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # as if scikit-learn were not installed
    with pytest.raises(ConfigError, match=r"needs scikit-learn: pip install 'theseus\[pmm\]'"):
        diabetes(0.2, 0)
