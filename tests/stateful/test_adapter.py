"""FlaxAdapter: a theseus Flax Module as a BaseModule gives the module's own outputs."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import configuration, configure, field
from theseus.model.layers import MLP
from theseus.model.module import Module
from theseus.stateful import FlaxAdapter, Linear, Model

KEY = jax.random.key(0)
X = jax.random.normal(jax.random.key(1), (2, 3, 4))


class Normed(Module):
    """A theseus Module with state: batch norm, then a dense layer."""

    width: int = field("architecture/normed/width", default=3, help="output width")

    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        x = nn.BatchNorm(use_running_average=deterministic, momentum=0.5)(x)
        return nn.Dense(self.width)(x)


def adapted(module, shape=(3, 4)):
    adapter = FlaxAdapter(module)
    adapter.compile(KEY, shape)
    return adapter, nn.meta.unbox(module.init(KEY, jnp.zeros((1, *shape))))


@pytest.mark.slow
def test_outputs_are_the_flax_modules_own():
    mlp = MLP(d_model=4, d_ff=8)
    adapter, variables = adapted(mlp)
    y, state = adapter(X)
    assert state == ()
    np.testing.assert_array_equal(y, mlp.apply(variables, X))
    assert adapter.get_output_shape((3, 4)) == (3, 4)


def test_params_are_leaves_in_jax_tree_order():
    adapter, variables = adapted(MLP(d_model=4, d_ff=8))
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(variables["params"])[0]]
    assert paths == ["['b_out']", "['b_up']", "['w_out']", "['w_up']"]
    expected = [variables["params"][name] for name in ("b_out", "b_up", "w_out", "w_up")]
    for got, want in zip(adapter.get_params(), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert adapter.get_num_trainable_floats() == 8 + 4 + 32 + 32


def test_training_passes_deterministic_and_the_dropout_rng():
    mlp = MLP(d_model=4, d_ff=8, dropout=0.5)
    adapter, variables = adapted(mlp)
    rng = jax.random.key(7)
    y, _ = adapter(X, training=True, rng=rng)
    np.testing.assert_array_equal(y, mlp.apply(variables, X, deterministic=False, rngs={"dropout": rng}))
    assert (y == 0).any()
    np.testing.assert_array_equal(adapter(X)[0], mlp.apply(variables, X))


@pytest.mark.slow
def test_state_is_the_other_collections():
    normed = Normed(width=2)
    adapter, variables = adapted(normed, (4,))
    assert [s.shape for s in adapter.get_state()] == [(4,), (4,)]  # batch_stats mean, var
    x = jax.random.normal(KEY, (8, 4)) * 3 + 1
    y, state = adapter(x, training=True)
    want, updates = normed.apply(variables, x, deterministic=False, mutable=["batch_stats"])
    np.testing.assert_allclose(y, want, rtol=1e-6)
    for got, expected in zip(state, jax.tree.leaves(updates), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    adapter.set_state(state)
    np.testing.assert_allclose(adapter(x)[0], normed.apply({**variables, **updates}, x), rtol=1e-6)


@pytest.mark.slow
def test_gradients_match_flax():
    mlp = MLP(d_model=4, d_ff=8)
    adapter, variables = adapted(mlp)
    forward = jax.jit(adapter._get_callable(), static_argnums=2)
    grads = jax.grad(lambda p: forward(p, X, True, (), None)[0].sum())(adapter.get_params())
    want = jax.grad(lambda p: mlp.apply({"params": p}, X).sum())(variables["params"])
    for got, expected in zip(grads, jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_configured_module_survives_save_and_load(tmp_path):
    with configuration({"architecture.d_model": 6, "architecture.d_ff": 12, "architecture.activation": "swiglu"}):
        mlp = configure(MLP)
    model = Model([FlaxAdapter(mlp)])
    model.compile(KEY, (2, 6))
    model.save(tmp_path / "mlp.npz")
    loaded = Model.load(tmp_path / "mlp.npz")
    (adapter,) = loaded.modules
    assert (adapter.module.d_model, adapter.module.d_ff, adapter.module.activation) == (6, 12, "swiglu")
    x = jax.random.normal(KEY, (3, 2, 6))
    np.testing.assert_array_equal(loaded(x)[0], model(x)[0])


def test_serialize_deserialize_gives_equal_outputs():
    adapter, _ = adapted(MLP(d_model=4, d_ff=8, activation="swiglu"))
    data = adapter.serialize()
    assert data["name"] == "FlaxAdapter"
    assert data["hyperparameters"]["module"] == "theseus.model.layers.MLP"
    assert data["hyperparameters"]["input_shape"] == (3, 4)
    assert data["hyperparameters"]["config"]["architecture.activation"] == "swiglu"
    copy = FlaxAdapter()
    copy.deserialize(data)
    np.testing.assert_array_equal(copy(X)[0], adapter(X)[0])


def test_set_precision_rebuilds_the_module_dtypes():
    adapter, _ = adapted(MLP(d_model=4, d_ff=8, param_dtype="bfloat16", activation_dtype="bfloat16"))
    assert {p.dtype for p in adapter.get_params()} == {jnp.dtype(jnp.bfloat16)}
    adapter.set_precision("single")
    assert {p.dtype for p in adapter.get_params()} == {jnp.dtype(jnp.float32)}
    assert (adapter.module.param_dtype, adapter.module.activation_dtype) == ("float32", "float32")
    assert adapter(X)[0].dtype == jnp.float32


@pytest.mark.slow
def test_errors():
    with pytest.raises(TypeError, match="FlaxAdapter wraps a theseus Module, got Dense"):
        FlaxAdapter(nn.Dense(3))
    with pytest.raises(ValueError, match=r"module 1 \(FlaxAdapter\) cannot take input shape \(5,\) \(module 0's output\): "
                                         r"MLP cannot take input shape \(5,\): "):
        Model([Linear(width=5), FlaxAdapter(MLP(d_model=4))]).compile(KEY, (3,))
    with pytest.raises(ValueError, match=r"MLP cannot take input shape \(2, 5\): "):
        FlaxAdapter(MLP(d_model=4)).compile(KEY, (2, 5))
    adapter, _ = adapted(MLP(d_model=4, d_ff=8))
    with pytest.raises(ValueError, match=r"expected params of shapes \[\(4,\), \(8,\), \(8, 4\), \(4, 8\)\]"):
        adapter.set_params(adapter.get_params()[::-1])
    with pytest.raises(RuntimeError, match="FlaxAdapter has no module"):
        FlaxAdapter().compile(KEY, (3, 4))
    with pytest.raises(TypeError, match="hyperparameters must be a dict"):
        adapter.set_hyperparameters("MLP")
    with pytest.raises(ValueError, match="hyperparameters are module, config and input_shape"):
        adapter.set_hyperparameters({"modul": "x"})
    with pytest.raises(ValueError, match="unknown Module class 'os.system'"):
        adapter.set_hyperparameters({"module": "os.system"})
