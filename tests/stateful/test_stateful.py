"""Linear, the elementwise activations and Flatten against numpy references."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.stateful import GELU, Flatten, Linear, ReLU, Sigmoid, Tanh

KEY = jax.random.key(0)
X = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_is_x_w_plus_b(bias):
    linear = Linear(width=3, bias=bias)
    linear.compile(KEY, (5,))
    params = [np.asarray(p) for p in linear.get_params()]
    assert [p.shape for p in params] == ([(5, 3), (3,)] if bias else [(5, 3)])
    linear.set_params([p + 1 for p in params])  # a non-zero bias
    expected = X @ (params[0] + 1) + (params[1] + 1 if bias else 0)
    np.testing.assert_allclose(linear(X)[0], expected, rtol=1e-5, atol=1e-6)


def test_linear_initialisation_is_lecun_normal():
    linear = Linear(width=200)
    linear.compile(KEY, (1000,))
    w, b = linear.get_params()
    assert w.dtype == jnp.float32
    assert abs(float(w.std()) * math.sqrt(1000) - 1) < 0.02 and abs(float(w.mean())) < 1e-3
    assert not b.any()


def test_linear_errors():
    with pytest.raises(ValueError, match=r"Linear expects input shape \(features,\), got \(2, 5\) \(put a Flatten before it\)"):
        Linear().compile(KEY, (2, 5))
    with pytest.raises(ValueError, match=r"Linear\(width=3, bias=True\) takes params \(W \[F, 3\], b \[3\]\), got shapes \[\(5, 3\)\]"):
        Linear(width=3).set_params((jnp.ones((5, 3)),))
    with pytest.raises(ValueError, match=r"Linear\(width=3, bias=False\) takes params \(W \[F, 3\]\), got shapes \[\(5, 4\)\]"):
        Linear(width=3, bias=False).set_params((jnp.ones((5, 4)),))
    with pytest.raises(RuntimeError, match="Linear has no parameters yet"):
        Linear().get_params()


@pytest.mark.parametrize(
    ("module", "reference"),
    [
        (ReLU(), lambda x: np.maximum(x, 0)),
        (Tanh(), np.tanh),
        (Sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
        (GELU(), np.vectorize(lambda v: v * (1 + math.erf(v / math.sqrt(2))) / 2)),
    ],
    ids=["relu", "tanh", "sigmoid", "gelu"],
)
def test_elementwise_activations(module, reference):
    x = X.reshape(6, 5, 1)
    assert module.is_ready() and module.get_params() == () and module.get_num_trainable_floats() == 0
    module.compile(KEY, (5, 1))
    assert module.get_output_shape((5, 1)) == (5, 1)
    np.testing.assert_allclose(module(x)[0], reference(x), rtol=1e-5, atol=1e-6)


def test_flatten():
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    flatten = Flatten()
    assert flatten.get_output_shape((3, 4)) == (12,) and flatten.get_output_shape(()) == (1,)
    np.testing.assert_array_equal(flatten(x)[0], x.reshape(2, 12))


def test_parameterless_modules_take_no_params():
    ReLU().set_params(())
    with pytest.raises(ValueError, match="Flatten has no trainable parameters, got 1 arrays"):
        Flatten().set_params((jnp.ones(3),))
