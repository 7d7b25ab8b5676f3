"""The ``regression`` task (``+experiment=pmm_regression`` picks it): an AffineEigenvaluePMM and
an MLP fitted to scikit-learn's diabetes data (the optional ``sklearn`` dependency) with
``Model.fit``, compared by test MSE. A JobTask: it runs the job itself, not the trainer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from theseus.config import ConfigError, Snapshot, configured, field
from theseus.stateful.elementwise import Tanh
from theseus.stateful.fit import FitSettings, train
from theseus.stateful.linear import Linear
from theseus.stateful.model import Model
from theseus.stateful.pmm import AffineEigenvaluePMM
from theseus.tasks.task import JobTask


@dataclasses.dataclass(frozen=True)
class PMMRegression(JobTask):
    """The pmm_regression experiment: an AffineEigenvaluePMM (with a linear read-out of its
    eigenvalues) and an MLP fitted to scikit-learn's diabetes data, compared by test MSE."""

    test_fraction: float = field("regression.test_fraction", default=0.2, help="fraction of the samples held out to test")
    mlp_hidden: int = field("regression.mlp_hidden", default=32, help="hidden width of the MLP baseline")

    @classmethod
    def components(cls) -> list[type]:
        return [FitSettings, AffineEigenvaluePMM]

    def run(self, cfg: Any, run_dir: Path) -> float:
        """The job of ``python -m theseus.run +experiment=pmm_regression``: fit both models,
        print and save (``results.json``) their test MSE; the PMM's is the objective."""
        results = run_regression(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        print("  ".join(f"{name} {value:.1f}" for name, value in results.items()))
        return results["pmm_test_mse"]


def run_regression(cfg: Any) -> dict[str, float]:
    """Run the pmm_regression experiment under ``cfg`` (the composed config).

    Returns ``{"pmm_test_mse": ..., "mlp_test_mse": ...}``, in squared target units.
    """
    values = Snapshot(cfg)
    experiment, settings = configured(PMMRegression, values), configured(FitSettings, values)
    pmm = configured(AffineEigenvaluePMM, values)
    x_train, y_train, x_test, y_test, y_scale = diabetes(experiment.test_fraction, settings.seed)
    models = {
        "pmm": Model([pmm, Linear(width=1)]),
        "mlp": Model([Linear(width=experiment.mlp_hidden), Tanh(), Linear(width=1)]),
    }
    results = {}
    for name, model in models.items():
        train(model, x_train, y_train, settings)
        pred, _ = model(x_test)
        results[f"{name}_test_mse"] = float(jnp.mean((pred - y_test) ** 2)) * y_scale**2
    return results


def diabetes(test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """scikit-learn's diabetes data (442 x 10 -> 1), split at random into train and test and
    standardised by the training statistics: ``(x_train, y_train, x_test, y_test, y_std)``."""
    try:  # an optional dependency (the pmm extra): only this experiment needs it; no download
        from sklearn.datasets import load_diabetes
    except ImportError as exc:
        raise ConfigError("the pmm_regression experiment needs scikit-learn: pip install 'theseus[pmm]'") from exc

    data = load_diabetes()
    x, y = data.data.astype(np.float32), data.target.astype(np.float32)[:, None]
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = round(test_fraction * len(x))
    test, fit = order[:n_test], order[n_test:]
    x_mean, x_std, y_mean, y_std = x[fit].mean(0), x[fit].std(0), y[fit].mean(), y[fit].std()
    return (x[fit] - x_mean) / x_std, (y[fit] - y_mean) / y_std, (x[test] - x_mean) / x_std, (y[test] - y_mean) / y_std, float(y_std)
