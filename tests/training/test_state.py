"""The train state's init is compiled at LLVM -O1 (INIT_COMPILER_OPTIONS: it runs once), to the values
that the default compilation gives."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

from theseus.base.mesh import MeshConfig, make_mesh
from theseus.config import configuration, configure
from theseus.model.models.gpt import GPT
from theseus.training.state import init_state, sharded_init


@pytest.mark.slow
def test_the_init_compiled_at_o1_equals_the_default_compilation():
    cfg = {"architecture.vocab_size": 64, "architecture.seq_len": 16, "architecture.n_layers": 2,
           "architecture.d_model": 32, "architecture.n_heads": 4, "architecture.positions": "rope"}
    with configuration(cfg):
        model = configure(GPT)
    tx = optax.adamw(1e-3)
    init, _, shardings = sharded_init(model, tx, 16, 3, model.plan(), make_mesh(MeshConfig(data=1)))
    default = jax.jit(lambda: nn.unbox(init_state(model, tx, 16, 3)), out_shardings=shardings).lower().compile(
        {"xla_backend_optimization_level": 2})()  # XLA's default, which the tests' XLA_FLAGS lower (conftest.py)
    leaves, expected = jax.tree.leaves(init()), jax.tree.leaves(default)
    assert len(leaves) == len(expected) > 20
    for got, want in zip(leaves, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
