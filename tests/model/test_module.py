"""The seed "Extend a Module": its examples verbatim, and the configuration trap."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support import tpu_mesh
from theseus.config import configuration, configure, field, schema_of
from theseus.model.module import Module

# --- the seed's examples, as written ----------------------------------------------------


class Scale(Module):
    factor: float = field("architecture/scale", default=1.0)

    @classmethod
    def components(cls):
        return []  # No configurable child modules.

    def __call__(self, x):
        return x * self.factor

from theseus.model.layers import MLP
from theseus.model.lora import LoRA

class FeedForward(Module):
    @classmethod
    def components(cls):
        return [MLP]

    def setup(self):
        self.mlp = configure(MLP)

    def __call__(self, x, deterministic=False):
        return self.mlp(x, deterministic=deterministic)

from theseus.base.axis import ShardingPlan

class ReplicatedFeedForward(FeedForward):
    @property
    def sharding(self):
        return ShardingPlan()

class CountedFeedForward(FeedForward):
    def flops(self, seq):
        return self.mlp.flops(seq)

# -----------------------------------------------------------------------------------------

SMALL = {"architecture.d_model": 8, "architecture.d_ff": 16}


def test_scale_key_is_derived_with_type_default_help():
    spec = schema_of(Scale)["architecture.scale"]
    assert (spec.type, spec.default, spec.owner) == (float, 1.0, Scale)
    assert schema_of(Scale)["architecture.dtype.param"].help  # inherited from Module


def test_scale_configured_and_default():
    x = jnp.arange(3.0)
    with configuration({"architecture": {"scale": 2.5}}):
        scaled = configure(Scale)
    assert np.allclose(scaled.apply({}, x), 2.5 * x)
    assert configure(Scale).factor == 1.0  # no active config: the default
    with configuration({"architecture.scale": 2.5}):
        assert configure(Scale, factor=4.0).factor == 4.0  # kwargs win


def test_feedforward_runs_and_counts_flops():
    with configuration(SMALL):
        model = configure(CountedFeedForward)
    x = jnp.ones((2, 5, 8))
    params = model.init(jax.random.key(0), x, deterministic=True)
    y = model.apply(params, x, deterministic=True)
    assert y.shape == (2, 5, 8)
    assert model.bind(params).flops(5) == 6 * 2 * 8 * 16 * 5
    assert CountedFeedForward.gather() == [CountedFeedForward, MLP, LoRA]  # the MLP's adapters
    assert "architecture.d_ff" in schema_of(CountedFeedForward)


def test_replicated_plan_is_empty():
    assert dict(ReplicatedFeedForward().sharding) == {}
    assert dict(Scale().sharding) == {} and Scale().flops(10) == 0


def test_children_built_lazily_see_the_configuration_after_it_closed():
    """The trap: setup() runs inside init/apply, under jit, long after the context closed."""
    with configuration(SMALL):
        model = configure(FeedForward)
    x = jnp.ones((1, 3, 8))
    params = jax.jit(lambda k: model.init(k, x, deterministic=True))(jax.random.key(0))
    assert params["params"]["mlp"]["w_out"].value.shape == (16, 8)  # not the default 3072 x 768
    y = jax.jit(lambda p: model.apply(p, x, deterministic=True))(params)
    assert y.shape == (1, 3, 8)
    clone = model.clone()  # Flax's clones keep the configuration too
    assert clone.init(jax.random.key(0), x, deterministic=True)["params"]["mlp"]["w_up"].value.shape == (8, 16)


def test_compact_children_see_the_configuration():
    class Compact(Module):
        @classmethod
        def components(cls):
            return [Scale]

        @nn.compact
        def __call__(self, x):
            return configure(Scale)(x)

    with configuration({"architecture.scale": 3.0}):
        model = configure(Compact)
    assert np.allclose(jax.jit(lambda x: model.apply({}, x))(jnp.ones(2)), 3.0)


def test_dtypes():
    m = Scale(activation_dtype="bfloat16", param_dtype="float32")
    assert m._activation_dtype == jnp.bfloat16 and m._param_dtype == jnp.float32
    assert Scale()._activation_dtype == jnp.float32  # auto on CPU
    with configuration({"architecture.dtype.activation": "float16"}):
        assert configure(Scale)._activation_dtype == jnp.float16
    with jax.set_mesh(tpu_mesh({"data": 4})):  # traced for a TPU (a dry run's mesh.target): bfloat16
        assert Scale()._activation_dtype == jnp.bfloat16 and m._param_dtype == jnp.float32


def test_subclass_may_declare_positional_fields():
    class Positional(Module):
        width: int

        def __call__(self, x):
            return x * self.width

    assert Positional(3).width == 3


def test_mlp_gelu_matches_reference_math():
    with configuration(SMALL):
        mlp = configure(MLP)
    x = jax.random.normal(jax.random.key(1), (2, 4, 8))
    params = mlp.init(jax.random.key(0), x)
    p = nn.unbox(params)["params"]
    h = jax.nn.gelu(x @ p["w_up"] + p["b_up"], approximate=True)
    assert np.allclose(mlp.apply(params, x), h @ p["w_out"] + p["b_out"], atol=1e-5)


def test_mlp_rejects_unknown_activation():
    from theseus.config import ConfigError

    with configuration({"architecture.activation": "relu"}), pytest.raises(ConfigError, match="architecture.activation must be one of gelu, swiglu"):
        configure(MLP)
