"""Model.fit's training loop (optax, jitted): ``train`` and its settings, ``FitSettings``.

``train`` shuffles into mini-batches every epoch (one jitted ``lax.scan`` per epoch), holds
out a validation split, stops early when the validation loss stops improving and keeps the
parameters of the best validation epoch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from theseus.config import Configurable, field
from theseus.stateful.base import BaseModule

Loss = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class FitSettings(Configurable):
    """Settings of ``Model.fit``."""

    epochs: int = field("fit.epochs", default=200, help="passes over the training data (at most)")
    batch_size: int = field("fit.batch_size", default=32, help="samples per optimizer step")
    lr: float = field("fit.lr", default=1e-2, help="Adam learning rate")
    val_fraction: float = field("fit.val_fraction", default=0.2, help="fraction of the samples held out to validate; 0: none")
    patience: int = field("fit.patience", default=20, help="epochs without a better validation loss before stopping; 0: never")
    seed: int = field("fit.seed", default=0, help="seed of the validation split, shuffling and initialisation")


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
