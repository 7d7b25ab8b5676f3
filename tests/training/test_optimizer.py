"""Schedules and the AdamW decay mask."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import ConfigError, configuration, configure
from theseus.training.optimizer import OptimizerConfig, decay_mask, make_optimizer, make_schedule


def schedule(**values):
    with configuration({f"optimizer.{k}": v for k, v in values.items()}):
        return make_schedule(configure(OptimizerConfig), 100)


def test_constant_with_warmup():
    lr = schedule(schedule="constant", lr=1.0, warmup_steps=10)
    assert [float(lr(s)) for s in (0, 5, 10, 99)] == pytest.approx([0.0, 0.5, 1.0, 1.0])


def test_cosine_reaches_min_ratio():
    lr = schedule(schedule="cosine", lr=2.0, warmup_steps=10, min_lr_ratio=0.1)
    assert float(lr(10)) == pytest.approx(2.0)
    halfway = 0.2 + (2.0 - 0.2) * 0.5 * (1 + math.cos(math.pi * 45 / 90))
    assert float(lr(55)) == pytest.approx(halfway, rel=1e-5)
    assert float(lr(100)) == pytest.approx(0.2, rel=1e-5)


def test_wsd_warmup_stable_decay():
    lr = schedule(schedule="wsd", lr=1.0, warmup_steps=10, min_lr_ratio=0.0, decay_fraction=0.2)
    assert [float(lr(s)) for s in (5, 10, 50, 80, 90, 100)] == pytest.approx([0.5, 1.0, 1.0, 1.0, 0.5, 0.0], abs=1e-6)


def test_warmup_longer_than_run_is_clamped():
    lr = schedule(schedule="cosine", lr=1.0, warmup_steps=1000)
    assert np.isfinite(float(lr(50))) and float(lr(100)) == pytest.approx(1.0)


def test_decay_mask_skips_norms_biases_embeddings():
    params = {"wte": {"embedding": jnp.ones((4, 2))}, "block": {"w": jnp.ones((2, 2)), "b": jnp.ones(2)},
              "ln": {"scale": jnp.ones(2)}}
    assert decay_mask(params) == {"wte": {"embedding": False}, "block": {"w": True, "b": False}, "ln": {"scale": False}}


def test_negative_lr_is_refused():
    with configuration({"optimizer.lr": -1.0}), pytest.raises(ConfigError, match="optimizer.lr must be positive"):
        make_optimizer(configure(OptimizerConfig), 10)
