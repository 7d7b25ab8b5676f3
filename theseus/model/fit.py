"""Model.fit's training loop (optax, jitted), and the pmm_regression experiment it runs.

``train`` shuffles into mini-batches every epoch (one jitted ``lax.scan`` per epoch), holds
out a validation split, stops early when the validation loss stops improving and keeps the
parameters of the best validation epoch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from theseus.config import ConfigError, Configurable, configuration, configure, field, register
from theseus.model.base import BaseModule, Model
from theseus.model.stateful import AffineEigenvaluePMM, Linear, Tanh

Loss = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class FitSettings(Configurable):
    """Settings of ``Model.fit``."""

    epochs: int = field("fit/epochs", default=200, help="passes over the training data (at most)")
    batch_size: int = field("fit/batch_size", default=32, help="samples per optimizer step")
    lr: float = field("fit/lr", default=1e-2, help="Adam learning rate")
    val_fraction: float = field("fit/val_fraction", default=0.2, help="fraction of the samples held out to validate; 0: none")
    patience: int = field("fit/patience", default=20, help="epochs without a better validation loss before stopping; 0: never")
    seed: int = field("fit/seed", default=0, help="seed of the validation split, shuffling and initialisation")


@dataclasses.dataclass(frozen=True)
class History:
    """What ``train`` did: per-epoch losses, and the epoch whose parameters the model kept."""

    loss: list[float]  # mean training loss of each epoch
    val_loss: list[float]  # validation loss after each epoch ([] without a validation split)
    best_epoch: int  # the best validation epoch (the last epoch without validation)


def mse(pred: jax.Array, target: jax.Array) -> jax.Array:
    """Mean squared error (of the modulus, for complex outputs)."""
    return jnp.mean(jnp.abs(pred - target) ** 2)


def train(model: BaseModule, X: Any, Y: Any, settings: FitSettings, *, loss: Loss = mse,
          optimizer: optax.GradientTransformation | None = None) -> History:
    """Fit ``model`` to ``X: [N, ...] -> Y: [N, ...]``; the model ends with the best parameters.

    Compiles the model for ``X.shape[1:]`` if it is not ready. ValueError if X and Y disagree
    in length, Y's per-sample shape is not the model's output shape, or nothing is left to
    train on.
    """
    X, Y = jnp.asarray(X), jnp.asarray(Y)
    if len(X) != len(Y):
        raise ValueError(f"X has {len(X)} samples but Y has {len(Y)}")
    key_split, key_init, key_epochs = jax.random.split(jax.random.key(settings.seed), 3)
    if not model.is_ready():
        model.compile(key_init, X.shape[1:])
    output_shape = tuple(model.get_output_shape(X.shape[1:]))
    if Y.shape[1:] != output_shape:
        raise ValueError(f"Y has per-sample shape {Y.shape[1:]} but {model.name()} outputs {output_shape}")
    order = jax.random.permutation(key_split, len(X))
    n_val = round(settings.val_fraction * len(X))
    if n_val >= len(X):
        raise ValueError(f"val_fraction={settings.val_fraction} leaves none of the {len(X)} samples to train on")
    x_val, y_val, x_train, y_train = X[order[:n_val]], Y[order[:n_val]], X[order[n_val:]], Y[order[n_val:]]

    optimizer = optimizer or optax.adam(settings.lr)
    forward = model._get_callable()
    epoch = jax.jit(_epoch_fn(forward, loss, optimizer, min(settings.batch_size, len(x_train))))
    evaluate = jax.jit(_evaluate_fn(forward, loss))

    params, state = model.get_params(), model.get_state()
    opt_state = optimizer.init(params)
    best = (math.inf, params, state, 0)
    losses, val_losses, waited = [], [], 0
    for i, key in enumerate(jax.random.split(key_epochs, settings.epochs)):
        params, opt_state, state, train_loss = epoch(params, opt_state, state, x_train, y_train, key)
        losses.append(float(train_loss))
        if not n_val:
            best = (math.inf, params, state, i)
            continue
        val_losses.append(float(evaluate(params, state, x_val, y_val)))
        if val_losses[-1] < best[0]:
            best, waited = (val_losses[-1], params, state, i), 0
        elif settings.patience and (waited := waited + 1) >= settings.patience:
            break
    _, params, state, best_epoch = best
    model.set_params(params)
    model.set_state(state)
    return History(loss=losses, val_loss=val_losses, best_epoch=best_epoch)


def _epoch_fn(forward, loss: Loss, optimizer: optax.GradientTransformation, batch_size: int):
    """One epoch: shuffle, then an optimizer step per full batch (a ``lax.scan``)."""

    def batch_loss(params, state, x, y, rng):
        pred, state = forward(params, x, True, state, rng)
        return loss(pred, y), state

    def step(carry, batch):
        params, opt_state, state, x, y = carry
        index, rng = batch
        (value, state), grads = jax.value_and_grad(batch_loss, has_aux=True)(params, state, x[index], y[index], rng)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, state, x, y), value

    def epoch(params, opt_state, state, x, y, key):
        key_order, key_steps = jax.random.split(key)
        steps = len(x) // batch_size
        batches = jax.random.permutation(key_order, len(x))[: steps * batch_size].reshape(steps, batch_size)
        (params, opt_state, state, _, _), values = jax.lax.scan(
            step, (params, opt_state, state, x, y), (batches, jax.random.split(key_steps, steps))
        )
        return params, opt_state, state, values.mean()

    return epoch


def _evaluate_fn(forward, loss: Loss):
    def evaluate(params, state, x, y):
        return loss(forward(params, x, False, state, None)[0], y)

    return evaluate


@register("model", "pmm_regression")
@dataclasses.dataclass(frozen=True)
class PMMRegression(Configurable):
    """The pmm_regression experiment: an AffineEigenvaluePMM (with a linear read-out of its
    eigenvalues) and an MLP fitted to scikit-learn's diabetes data, compared by test MSE."""

    test_fraction: float = field("regression/test_fraction", default=0.2, help="fraction of the samples held out to test")
    mlp_hidden: int = field("regression/mlp_hidden", default=32, help="hidden width of the MLP baseline")

    @classmethod
    def components(cls) -> list[type]:
        return [FitSettings, AffineEigenvaluePMM]

    @classmethod
    def run(cls, cfg: Any, run_dir: Path) -> float:
        """The task of ``python -m theseus.run +experiment=pmm_regression``: fit both models,
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
    with configuration(cfg):
        experiment, settings, pmm = configure(PMMRegression), configure(FitSettings), configure(AffineEigenvaluePMM)
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
