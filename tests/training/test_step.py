"""The train step's refusal of non-finite updates, on a toy regression model."""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from theseus.config import field
from theseus.model.module import Module
from theseus.tasks.task import LossTask
from theseus.training.state import init_state
from theseus.training.step import train_step


class Linear(Module):
    """``tokens: int[batch, seq] -> [batch, seq, 2]``: a weight per position's value, for tests."""

    width: int = field("architecture/width", default=2)

    def setup(self):
        self.w = self.param("w", jax.nn.initializers.ones, (self.width,))

    def __call__(self, tokens, deterministic=True):
        return tokens[..., None].astype(jnp.float32) * self.w


def loss_fn(logits, targets):
    """Mean squared error, NaN when any target is negative (a planted bad batch)."""
    bad = jnp.any(targets < 0)
    return jnp.where(bad, jnp.nan, jnp.mean((logits - targets[..., None]) ** 2))


@dataclasses.dataclass(frozen=True)
class NextValue(LossTask):
    """Predict each position's next value (``loss_fn``) from ``batch[:, :-1]``."""

    def loss(self, model, params, batch, rng):
        return loss_fn(model.apply({"params": params}, batch[:, :-1], deterministic=rng is None), batch[:, 1:])


@pytest.mark.parametrize("skip", [False, True])
def test_nonfinite_updates_are_refused(skip):
    model, tx = Linear(), optax.sgd(0.01)
    state = nn.unbox(init_state(model, tx, seq_len=3, seed=0))
    step = jax.jit(functools.partial(train_step, model=model, task=NextValue(), tx=tx, schedule=lambda s: 0.01,
                                     skip_nonfinite=skip))
    good = (jnp.arange(8, dtype=jnp.int32).reshape(1, 2, 4) % 3) + 1
    bad = good.at[0, 0, -1].set(-1)
    key = jax.random.key(0)
    after_good, _ = step(state, good, key)
    assert not np.allclose(after_good.params["w"], state.params["w"])
    after_bad, metrics = step(after_good, bad, key)
    np.testing.assert_array_equal(after_bad.params["w"], after_good.params["w"])  # refused
    assert int(after_bad.first_nonfinite) == 2 and int(metrics["nonfinite_skipped"]) == 1
    after_next, _ = step(after_bad, good, key)
    moved = not np.allclose(after_next.params["w"], after_bad.params["w"])
    assert moved == skip  # skipping goes on; stopping keeps the last good state
    assert int(after_next.step) == 3 and int(after_next.first_nonfinite) == 2
