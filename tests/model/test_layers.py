"""Layer math against independent references (numpy formulas, naive attention)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import configuration, configure
from theseus.model.layers import (MLP, Attention, Embedding, LayerNorm, RMSNorm, RoPE, contract,
                                  weight_product)

D = 16
SMALL = {"architecture.d_model": D, "architecture.n_heads": 4, "architecture.d_ff": 24}


def build(cls, **overrides):
    with configuration({**SMALL, **overrides}):
        return configure(cls)


def normal(*shape: int, seed: int = 1) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def random_params(module, *args, seed=0):
    """Variables shaped as ``module.init``'s, every leaf standard-normal (biases and scales too),
    drawn with numpy: no RNG kernels to compile."""
    rng = np.random.default_rng(seed)
    abstract = nn.unbox(jax.eval_shape(module.init, jax.random.key(0), *args))
    return jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape), s.dtype), abstract)


def test_layernorm_matches_formula_in_float32_for_bfloat16_activations():
    norm = build(LayerNorm, **{"architecture.dtype.activation": "bfloat16"})
    x = 3.0 + 2.0 * normal(2, 5, D, seed=1)
    params = random_params(norm, x)
    y = norm.apply(params, x.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    p, xs = params["params"], np.asarray(x.astype(jnp.bfloat16), np.float64)
    ref = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-5) * p["scale"] + p["bias"]
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_gradients_equal_autodiff_of_the_formula(bias):
    """``normalize``'s closed-form backward against jax's autodiff of the two-pass formula."""
    norm = build(LayerNorm, **{"architecture.bias": bias})
    x = 3.0 + 2.0 * normal(2, 5, D, seed=1)
    p = random_params(norm, x, seed=2)["params"]

    def formula(p, x):
        centred = x - x.mean(-1, keepdims=True)
        return centred / jnp.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5) * p["scale"] + p.get("bias", 0.0)

    def grads(fn):  # a loss that weighs every output differently, so each partial matters
        return jax.grad(lambda p, x: jnp.sum(jnp.sin(fn(p, x)) * normal(2, 5, D, seed=3)), argnums=(0, 1))(p, x)

    got, want = grads(lambda p, x: norm.apply({"params": p}, x)), grads(formula)
    assert set(got[0]) == set(want[0]) == ({"scale", "bias"} if bias else {"scale"})
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_layernorm_without_bias_has_no_bias_param():
    norm = build(LayerNorm, **{"architecture.bias": False})
    assert set(random_params(norm, jnp.ones((1, D)))["params"]) == {"scale"}


def test_rmsnorm_matches_formula():
    norm = build(RMSNorm)
    x = normal(2, 5, D, seed=1)
    params = random_params(norm, x)
    xs = np.asarray(x, np.float64)
    ref = xs / np.sqrt((xs**2).mean(-1, keepdims=True) + 1e-5) * params["params"]["scale"]
    np.testing.assert_allclose(norm.apply(params, x), ref, rtol=1e-5, atol=1e-5)


def test_rope_is_a_complex_rotation_by_position_times_frequency():
    rope = build(RoPE, **{"architecture.rope_theta": 500.0})
    x = normal(2, 7, 3, 8, seed=0)
    positions = jnp.arange(7) + 5
    xs = np.asarray(x, np.float64)
    z = xs[..., :4] + 1j * xs[..., 4:]  # pair (i, i + 4) as one complex number
    freq = 500.0 ** (-2 * np.arange(4) / 8)
    z = z * np.exp(1j * np.asarray(positions)[:, None, None] * freq)
    np.testing.assert_allclose(rope.apply({}, x, positions), np.concatenate([z.real, z.imag], -1), atol=1e-5)


def test_rope_scores_depend_on_relative_position_only():
    rope = build(RoPE)
    q, k = normal(2, 1, 1, 1, 16, seed=0)

    def score(m, n):
        return jnp.sum(rope.apply({}, q, jnp.array([m])) * rope.apply({}, k, jnp.array([n])))

    assert np.isclose(score(3, 1), score(10, 8), atol=1e-5) and np.isclose(score(0, 0), jnp.sum(q * k), atol=1e-5)
    assert not np.isclose(score(3, 1), score(1, 3), atol=1e-3)


def naive_attention(x, p, n_heads, n_kv_heads):
    """Causal attention in float64 numpy: q, k, v per head, softmax(q k^T / sqrt(d)) v."""
    x = np.asarray(x, np.float64)
    q = np.einsum("bsd,dnh->bnsh", x, p["wq"]) + p["bq"][None, :, None]
    k = np.einsum("bsd,dnh->bnsh", x, p["wk"]) + p["bk"][None, :, None]
    v = np.einsum("bsd,dnh->bnsh", x, p["wv"]) + p["bv"][None, :, None]
    group = n_heads // n_kv_heads
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    seq = x.shape[1]
    scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnsh,nhd->bsd", probs @ v, p["wo"]) + p["bo"]


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_attention_matches_naive_causal_attention(n_kv_heads):
    attn = build(Attention, **{"architecture.n_kv_heads": n_kv_heads})
    x = normal(2, 6, D, seed=1)
    positions = jnp.arange(6)
    params = random_params(attn, x, positions, seed=n_kv_heads)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
    np.testing.assert_allclose(attn.apply(params, x, positions), naive_attention(x, p, 4, n_kv_heads), atol=1e-4)


def reference_attention(p, x, n_heads, n_kv_heads):
    """Causal attention in jax: one einsum per projection, softmax over masked scores."""
    q, k, v = (jnp.einsum("bsd,dnh->bnsh", x, p[w]) + (p[b][None, :, None] if b in p else 0.0)
               for w, b in (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
    k, v = jnp.repeat(k, n_heads // n_kv_heads, axis=1), jnp.repeat(v, n_heads // n_kv_heads, axis=1)
    seq = x.shape[1]
    scores = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]), -jnp.inf)
    return jnp.einsum("bnsh,nhd->bsd", jax.nn.softmax(scores, axis=-1) @ v, p["wo"]) + p.get("bo", 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("n_kv_heads, bias", [(4, True), (2, True), (4, False)])
def test_attention_gradients_match_a_reference(n_kv_heads, bias):
    """Gradients through jax.nn.dot_product_attention's causal path, GQA's shared heads and
    the optional biases equal those of the plain formula."""
    attn = build(Attention, **{"architecture.n_kv_heads": n_kv_heads, "architecture.bias": bias})
    x = normal(2, 6, D, seed=1)
    positions = jnp.arange(6)
    p = random_params(attn, x, positions, seed=3)["params"]

    def loss(fn):
        return jax.grad(lambda p, x: jnp.sum(jnp.sin(fn(p, x))), argnums=(0, 1))(p, x)

    got = loss(lambda p, x: attn.apply({"params": p}, x, positions))
    want = loss(lambda p, x: reference_attention(p, x, 4, n_kv_heads))
    assert set(got[0]) == set(want[0]) == ({"wq", "wk", "wv", "wo"} | ({"bq", "bk", "bv", "bo"} if bias else set()))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3)  # float32, standard-normal weights: sharp softmaxes


def test_grouped_query_attention_equals_mha_with_repeated_kv_heads():
    gqa, mha = build(Attention, **{"architecture.n_kv_heads": 2}), build(Attention)
    x = normal(2, 6, D, seed=1)
    positions = jnp.arange(6)
    p = random_params(gqa, x, positions)["params"]
    repeated = {**p, **{name: jnp.repeat(p[name], 2, axis=-2) for name in ("wk", "wv", "bk", "bv")}}
    assert repeated["wk"].shape == random_params(mha, x, positions)["params"]["wk"].shape
    np.testing.assert_allclose(
        gqa.apply({"params": p}, x, positions), mha.apply({"params": repeated}, x, positions), rtol=1e-6, atol=1e-5
    )


def test_attention_output_at_a_position_ignores_later_positions():
    attn = build(Attention, **{"architecture.positions": "rope"})
    x = normal(1, 6, D, seed=1)
    positions = jnp.arange(6)
    params = random_params(attn, x, positions)
    changed = x.at[:, 4:].set(0.0)
    before, after = attn.apply(params, x, positions), attn.apply(params, changed, positions)
    np.testing.assert_allclose(before[:, :4], after[:, :4], atol=1e-6)
    assert not np.allclose(before[:, 4:], after[:, 4:])


def test_swiglu_mlp_matches_formula():
    mlp = build(MLP, **{"architecture.activation": "swiglu", "architecture.bias": False})
    x = normal(2, 3, D, seed=1)
    params = random_params(mlp, x)
    p = params["params"]
    assert set(p) == {"w_gate", "w_up", "w_out"} and p["w_gate"].shape == p["w_up"].shape == (D, 24)
    ref = (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_out"]
    np.testing.assert_allclose(mlp.apply(params, x), ref, rtol=1e-5, atol=1e-5)


def test_dropout_honours_deterministic():
    mlp = build(MLP, **{"architecture.dropout": 0.5})
    x = jnp.ones((2, 3, D))
    params = random_params(mlp, x)
    plain = build(MLP).apply(params, x)
    np.testing.assert_array_equal(mlp.apply(params, x, deterministic=True), plain)
    dropped = mlp.apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
    kept = np.asarray(dropped) != 0
    assert 0 < kept.mean() < 1
    np.testing.assert_allclose(np.asarray(dropped)[kept], 2 * np.asarray(plain)[kept], rtol=1e-5)


def test_embedding_lookup_and_tied_head():
    emb = build(Embedding, **{"architecture.vocab_size": 11})
    tokens = jnp.array([[0, 3, 10]])
    params = random_params(emb, tokens)
    table = params["params"]["embedding"]
    np.testing.assert_array_equal(emb.apply(params, tokens), table[tokens])
    x = normal(1, 3, D, seed=1)
    np.testing.assert_allclose(emb.apply(params, x, method=Embedding.attend), x @ table.T, atol=1e-6)


def test_bfloat16_matmuls_multiply_in_bfloat16_and_keep_float32_activations():
    """``architecture.dtype.matmul=bfloat16`` on a float32 model: every weight's product takes
    bfloat16 inputs and returns float32 (its sums in float32), so the MLP equals the float32 MLP
    of bfloat16-rounded inputs and weights, not the float32 MLP itself."""
    mlp = build(MLP, **{"architecture.dtype.matmul": "bfloat16", "architecture.bias": False})
    x = normal(2, 5, D, seed=1)
    p = random_params(mlp, x)
    y = mlp.apply(p, x)
    assert y.dtype == jnp.float32
    text = jax.jit(mlp.apply).lower(p, x).as_text()
    assert "bf16" in text and "dot_general" in text
    rounded = lambda a: np.asarray(jnp.asarray(a).astype(jnp.bfloat16), np.float64)  # noqa: E731
    w_up, w_out = p["params"]["w_up"], p["params"]["w_out"]
    h = rounded(x) @ rounded(w_up)
    h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))  # GELU (tanh), in float32 between
    np.testing.assert_allclose(np.asarray(y, np.float64), rounded(h.astype(np.float32)) @ rounded(w_out), rtol=1e-4,
                               atol=1e-5)
    exact = build(MLP, **{"architecture.bias": False}).apply(p, x)
    assert not np.allclose(np.asarray(y), np.asarray(exact), rtol=1e-5, atol=1e-6)  # the products did round


SIZES = dict(zip("bsdfhkvecn", (2, 5, 6, 7, 3, 4, 9, 2, 3, 2), strict=True))


def assert_gradients_are_the_einsums(product, equation: str) -> None:
    """``product(x, w, accumulate)`` has ``jnp.einsum(equation)``'s values and gradients in float32,
    and with bfloat16 inputs accumulated in float32 as well, each gradient in its input's dtype
    (the einsum's differentiation multiplies the output's gradient unrounded, ours in bfloat16)."""
    ins, out = equation.split("->")
    x_axes, w_axes = ins.split(",")
    x, w = normal(*(SIZES[a] for a in x_axes), seed=1), normal(*(SIZES[a] for a in w_axes), seed=2)
    weights = normal(*(SIZES[a] for a in out), seed=3)  # a loss that weighs every output differently
    for dtype, accumulate, tolerance in ((jnp.float32, None, 1e-5), (jnp.bfloat16, jnp.float32, 1e-2)):
        def loss(product, x, w):
            return jnp.sum(product(x.astype(dtype), w.astype(dtype)).astype(jnp.float32) * weights)
        ours = jax.value_and_grad(functools.partial(loss, lambda x, w: product(x, w, accumulate)),
                                  argnums=(0, 1))(x, w)
        theirs = jax.value_and_grad(functools.partial(loss, lambda x, w: jnp.einsum(equation, x, w,
                                                                                    preferred_element_type=accumulate)),
                                    argnums=(0, 1))(x, w)
        for got, expected in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
            assert got.dtype == expected.dtype
            np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("equation", ["bsd,df->bsf", "bshk,hkd->bsd", "bsd,dnh->bsnh", "bsd,vd->bsv",
                                      "ebcd,edf->ebcf", "nbsd,ndf->nbsf"])
def test_weight_products_gradients_are_the_einsums(equation):
    """``weight_product``'s own backward (the weight's gradient over one merged token axis)
    gives the gradients that differentiating ``jnp.einsum`` gives."""
    assert_gradients_are_the_einsums(functools.partial(weight_product, equation), equation)


@pytest.mark.parametrize(("a_axes", "b_axes", "out", "summed"), [("bsnh", "dnh", "bsd", 1), ("bsd", "bsnh", "dnh", 1),
                                                                 ("bsnh", "dhn", "bsd", 2), ("bsd", "df", "bsf", 1)])
def test_contract_sums_over_one_merged_axis_where_the_operands_allow(a_axes, b_axes, out, summed):
    """Axes summed over, adjacent and in the same order in both operands, reach XLA as one
    (several make its CPU backend copy both operands transposed); the value is einsum's."""
    sizes = dict(zip("bsdfnh", (2, 5, 6, 7, 3, 4), strict=True))
    a, b = normal(*(sizes[x] for x in a_axes), seed=1), normal(*(sizes[x] for x in b_axes), seed=2)
    (product,) = [eqn for eqn in jax.make_jaxpr(functools.partial(contract, a_axes, b_axes, out))(a, b).jaxpr.eqns
                  if eqn.primitive.name == "dot_general"]
    assert len(product.params["dimension_numbers"][0][0]) == summed
    np.testing.assert_allclose(contract(a_axes, b_axes, out, a, b), jnp.einsum(f"{a_axes},{b_axes}->{out}", a, b),
                               rtol=1e-5, atol=1e-5)
