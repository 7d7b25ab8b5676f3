"""The train state's init is compiled at LLVM -O1 (INIT_COMPILER_OPTIONS: it runs once), to the values
that the default compilation gives; a parameter the mesh does not split evenly is refused in one line."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh

from theseus.base.axis import MESH_AXES, ShardingPlan
from theseus.base.mesh import MeshConfig, make_mesh
from theseus.config import ConfigError, configuration, configure
from theseus.model.models.gpt import GPT
from theseus.training.state import check_divisible, init_state, sharded_init


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


def test_a_parameter_the_mesh_does_not_split_evenly_is_named_with_the_fix():
    """3 experts over mesh.expert=2: one line naming the parameter, its axis and the mesh axis;
    kept whole (mesh.rules.expert=null), or over a size that divides 3, it passes."""
    params = {"h_0": {"moe": {"w_up": nn.Partitioned(jax.ShapeDtypeStruct((3, 8), jnp.float32),
                                                     names=("expert", "embed"))}}}
    plan = ShardingPlan(expert="expert", embed="fsdp")
    mesh = AbstractMesh((1, 1, 2, 1), MESH_AXES)
    with pytest.raises(ConfigError) as err:
        check_divisible(params, plan, mesh)
    assert str(err.value) == ("parameter h_0/moe/w_up [3, 8] has 3 along its 'expert' axis "
                              "(architecture.moe.n_experts=3), which mesh.expert=2 does not split evenly: set "
                              "architecture.moe.n_experts to a multiple of 2, give mesh sizes that divide 3, or keep "
                              "that axis whole on every device (mesh.rules.expert=null)")
    with pytest.raises(ConfigError, match=r"^parameter h_0/moe/w_up \[3, 8\] has 8 along its 'embed' axis, which "
                                          r"mesh.fsdp=3 does not split evenly: give mesh sizes that divide 8, or keep "
                                          r"that axis whole on every device \(mesh.rules.embed=null\)$"):
        check_divisible(params, plan, AbstractMesh((1, 3, 1, 1), MESH_AXES))  # no one key sizes embed: none named
    check_divisible(params, MeshConfig(rules={"expert": None}).apply(plan), mesh)
    check_divisible(params, plan, AbstractMesh((1, 1, 3, 1), MESH_AXES))


def test_the_state_around_given_params_is_the_initialised_state_with_them():
    """``init(params)``, what a run from weights starts with: the params as given (not copied),
    the optimizer's state, step and counters as an init makes them, laid out alike (AdamW's
    moments zero, a masked decay's tree as init's), nothing drawn."""
    cfg = {"architecture.vocab_size": 64, "architecture.seq_len": 16, "architecture.n_layers": 2,
           "architecture.d_model": 32, "architecture.n_heads": 4}
    with configuration(cfg):
        model = configure(GPT)
    tx = optax.adamw(1e-3, mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params))
    init, target, _ = sharded_init(model, tx, 16, 3, model.plan(), make_mesh(MeshConfig(data=1)))
    initialised = init()
    given = jax.tree.map(lambda p: p + 1, initialised.params)
    around = init(given)
    assert jax.tree.structure(around) == jax.tree.structure(initialised)
    assert all(a is b for a, b in zip(jax.tree.leaves(around.params), jax.tree.leaves(given), strict=True))
    for got, want, layout in zip(jax.tree.leaves(around.replace(params=None)), jax.tree.leaves(
            initialised.replace(params=None)), jax.tree.leaves(target.replace(params=None)), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert got.sharding == layout.sharding
