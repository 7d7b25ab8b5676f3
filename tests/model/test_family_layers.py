"""The layer fields other model families need (Qwen3, Mistral, Gemma, Llama 3.x), each against an
independent reference: naive float64 attention, numpy formulas, transformers' RoPE functions;
and the KV-cache decode path of a model with sliding and global layers against its full forward."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model.test_layers import build, normal, random_params

from theseus.config import ConfigError, configuration, configure
from theseus.model.layers import MLP, Attention, Block, OffsetRMSNorm, RoPE, packed
from theseus.model.models.gpt import GPT

D = 16


def naive(x, p, heads, kv, window=None, cap=None, scale_dim=None, segments=None, qk_norm=None):
    """Causal attention in float64 numpy, each query seeing the keys at most ``window - 1`` before
    it (and of its segment), its scores scaled by ``scale_dim ** -0.5``, soft-capped by ``cap``,
    queries and keys RMS-normalised per head first with gains ``qk_norm`` (q's, k's)."""
    x = np.asarray(x, np.float64)
    q, k, v = (np.einsum("bsd,dnh->bnsh", x, p[w]) for w in ("wq", "wk", "wv"))
    if qk_norm is not None:
        q, k = (t / np.sqrt((t**2).mean(-1, keepdims=True) + 1e-5) * g for t, g in zip((q, k), qk_norm, strict=True))
    k, v = np.repeat(k, heads // kv, axis=1), np.repeat(v, heads // kv, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(scale_dim or q.shape[-1])
    if cap is not None:
        scores = cap * np.tanh(scores / cap)
    seq = x.shape[1]
    i = np.arange(seq)
    allowed = (i[:, None] >= i) & (i[:, None] - i < (window or seq))
    if segments is not None:
        allowed = allowed & (segments[:, None, :, None] == segments[:, None, None, :])
    scores = np.where(allowed, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnsh,nhd->bsd", probs @ v, p["wo"])


@pytest.mark.parametrize("keys", [
    {"architecture.sliding_window": 3},
    {"architecture.sliding_window": 4, "architecture.attn_softcap": 1.5, "architecture.attn_scale_dim": 5},
    {"architecture.head_dim": 8, "architecture.qk_norm": True, "architecture.norm": "rmsnorm"},
    {"architecture.head_dim": 6, "architecture.attn_softcap": 2.0, "architecture.qk_norm": True,
     "architecture.norm": "rmsnorm", "architecture.sliding_window": 2},
], ids=["window", "window-softcap-scale", "head_dim-qk_norm", "all"])
@pytest.mark.parametrize("packed_rows", [False, True])
@pytest.mark.parametrize("impl", [None, "xla"])
def test_attention_fields_match_naive_attention(keys, packed_rows, impl):
    """Sliding window, soft-capped scores, their scale, heads of their own width and q/k norms,
    alone and together, over packed segments too, in theseus's written-out attention (null) and
    in jax.nn.dot_product_attention's XLA path (xla; soft-capped scores stay written out)."""
    attn = build(Attention, **{"architecture.n_kv_heads": 2, "architecture.bias": False,
                               "architecture.attention_impl": impl, **keys})
    x = normal(2, 9, D, seed=1)
    positions = jnp.arange(9)
    segments = np.array([[1] * 4 + [2] * 5, [1] * 9]) if packed_rows else None
    params = random_params(attn, x, positions, seed=2)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
    norms = (p["q_norm"]["scale"], p["k_norm"]["scale"]) if "q_norm" in p else None
    assert p["wq"].shape == (D, 4, keys.get("architecture.head_dim", 4))
    want = naive(x, p, 4, 2, keys.get("architecture.sliding_window"), keys.get("architecture.attn_softcap"),
                 keys.get("architecture.attn_scale_dim"), segments, norms)
    got = attn.apply(params, x, positions, segments=None if segments is None else jnp.asarray(segments))
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_offset_rmsnorm_and_geglu_match_their_formulas():
    """Gemma's RMSNorm (gain 1 + w, w starting at 0) and GeGLU (tanh-approximated gelu gate)."""
    norm = build(OffsetRMSNorm)
    x = normal(2, 5, D, seed=1)
    assert not np.asarray(nn.unbox(norm.init(jax.random.key(0), x))["params"]["scale"]).any()  # 0: a gain of 1
    params = random_params(norm, x)
    xs = np.asarray(x, np.float64)
    want = xs / np.sqrt((xs**2).mean(-1, keepdims=True) + 1e-5) * (1 + np.asarray(params["params"]["scale"]))
    np.testing.assert_allclose(norm.apply(params, x), want, rtol=1e-5, atol=1e-5)

    mlp = build(MLP, **{"architecture.activation": "geglu", "architecture.bias": False})
    p = random_params(mlp, x)["params"]
    xs, w_gate, w_up, w_out = (np.asarray(a, np.float64) for a in (x, p["w_gate"], p["w_up"], p["w_out"]))
    gate = xs @ w_gate
    gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate**3)))
    np.testing.assert_allclose(mlp.apply({"params": p}, x), (gelu * (xs @ w_up)) @ w_out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
])
def test_rope_scaling_is_transformers_frequencies(scaling):
    """``rope_scaling.*`` against transformers' own functions (``ROPE_INIT_FUNCTIONS``), on a
    head of 16 whose feature pairs fall in every llama3 band."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=128,
                                      rope_parameters={**scaling, "rope_theta": 500000.0})
    want, factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
    names = {"factor": "factor", "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
             "original_max_position_embeddings": "original_seq_len"}
    rope = build(RoPE, **{"architecture.rope_theta": 500000.0, "architecture.rope_scaling.type": scaling["rope_type"],
                          **{f"architecture.rope_scaling.{names[k]}": v for k, v in scaling.items() if k in names}})
    got = rope.bind({}).inv_freq(16)
    assert factor == 1.0 and not np.allclose(got, build(RoPE, **{"architecture.rope_theta": 500000.0}).bind({})
                                             .inv_freq(16))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


GEMMA_LIKE = {"architecture.vocab_size": 50, "architecture.n_layers": 4, "architecture.d_model": D,
              "architecture.n_heads": 4, "architecture.n_kv_heads": 2, "architecture.head_dim": 8,
              "architecture.seq_len": 32, "architecture.positions": "rope", "architecture.norm": "rmsnorm_offset",
              "architecture.activation": "geglu", "architecture.bias": False, "architecture.post_norms": True,
              "architecture.scale_embeddings": True, "architecture.qk_norm": True, "architecture.attn_softcap": 3.0,
              "architecture.logit_softcap": 4.0, "architecture.sliding_window": 5, "architecture.global_every": 2,
              "architecture.rope_theta_local": 100.0, "architecture.rope_scaling.type": "linear"}


@pytest.mark.slow
def test_sliding_and_global_layers_differ_and_decode_through_the_cache_as_the_full_forward():
    """A Gemma-like GPT: layers 0 and 2 slide (window 5, local RoPE base), 1 and 3 attend
    globally; the KV-cache decode path, a prompt of 3 then a token at a time to 20 positions
    (past the window), gives the full forward's logits at every position."""
    with configuration(GEMMA_LIKE):
        model = configure(GPT)
    assert [model.layer_settings(i) for i in range(2)] == [
        {"architecture.rope_theta": 100.0, "architecture.rope_scaling.type": "none"},
        {"architecture.sliding_window": None}]
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 20)), jnp.int32)
    params = random_params(model, tokens, seed=4)["params"]
    params = jax.tree.map(lambda a: 0.3 * a, params)
    full = jax.jit(model.apply)({"params": params}, tokens)
    assert float(jnp.abs(full).max()) < 4.0  # soft-capped

    decoder = model.clone(decode=True)
    shapes = jax.eval_shape(decoder.init, jax.random.key(0), tokens)["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    step = jax.jit(lambda cache, chunk: decoder.apply({"params": params, "cache": cache}, chunk, mutable=["cache"]))
    steps, start = [], 0
    for stop in (3, *range(4, 21)):
        logits, variables = step(cache, tokens[:, start:stop])
        cache, start = variables["cache"], stop
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=2e-5)
    windowless = model.clone(sliding_window=None, global_every=0, rope_theta_local=None)
    assert np.abs(np.asarray(jax.jit(windowless.apply)({"params": params}, tokens)[:, 6:] - full[:, 6:])).max() > 1e-3


@pytest.mark.parametrize(("keys", "message"), [
    ({"architecture.global_every": 2}, "architecture.global_every=2 sets the sliding-window layers apart, but "
                                       "architecture.sliding_window is null: set architecture.sliding_window=W"),
    ({"architecture.sliding_window": 4, "architecture.global_every": 2, "architecture.scan_layers": True},
     "architecture.scan_layers=true repeats one block, but architecture.global_every=2 mixes sliding-window and "
     "global layers: set architecture.scan_layers=false"),
    ({"architecture.head_dim": 5, "architecture.positions": "rope"},
     "architecture.positions=rope needs an even head size, but architecture.head_dim = 5"),
    ({"architecture.attn_softcap": 5.0, "architecture.attention_impl": "cudnn",
      "architecture.dtype.activation": "bfloat16"}, "architecture.attn_softcap soft-caps"),
    ({"architecture.rope_scaling.type": "llama3", "architecture.rope_scaling.low_freq_factor": 4.0,
      "architecture.positions": "rope"}, "architecture.rope_scaling.high_freq_factor \\(4.0\\) must exceed"),
])
def test_layer_fields_out_of_place_are_one_line(keys, message):
    with pytest.raises(ConfigError, match=message), configuration({**SMALL_GPT, **keys}):
        model = configure(GPT)
        jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))


SMALL_GPT = {"architecture.vocab_size": 50, "architecture.n_layers": 2, "architecture.d_model": D,
             "architecture.n_heads": 4, "architecture.seq_len": 16}


def test_segments_reach_only_a_layer_that_takes_them():
    """A user's attention written before packing (``__call__(self, x, positions, deterministic=True)``)
    is called without segments=; packed sequences refuse it in one line naming its signature."""

    class Old(Attention):
        def __call__(self, x, positions, deterministic=True):
            return super().__call__(x, positions, deterministic)

    class Keywords(Attention):
        def __call__(self, x, positions, deterministic=True, **kwargs):
            return super().__call__(x, positions, deterministic, **kwargs)

    segments = jnp.ones((1, 4), jnp.int32)
    assert packed(Old, None) == {} and packed(Block, segments).keys() == packed(Keywords, segments).keys() == {"segments"}
    with pytest.raises(ConfigError) as error:
        packed(Old, segments)
    assert str(error.value) == (
        f"{__name__}.test_segments_reach_only_a_layer_that_takes_them.<locals>.Old.__call__(self, x, positions, "
        f"deterministic=True) takes no segments=, which task=sft passes (its conversations packed in windows, each "
        f"attending to itself): add a `segments=None` parameter and pass it on (super().__call__(..., "
        f"segments=segments))")
