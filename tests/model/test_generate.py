"""generate(): the KV cache reproduces full forward passes, past the context too (a sliding
window of seq_len tokens); one compilation per shape."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import configuration, configure
from theseus.model import generate as generation
from theseus.model.generate import continue_prompts, generate, sample_text
from theseus.model.models.gpt import GPT

TINY = {
    "architecture.vocab_size": 64, "architecture.seq_len": 16, "architecture.n_layers": 2,
    "architecture.d_model": 32, "architecture.n_heads": 4,
}
CONFIGS = {
    "gpt2": TINY,
    "llama": {
        **TINY, "architecture.norm": "rmsnorm", "architecture.activation": "swiglu", "architecture.positions": "rope",
        "architecture.bias": False, "architecture.tie_embeddings": False, "architecture.n_kv_heads": 2,
    },
    "bytes": {**TINY, "architecture.vocab_size": 256},
}


@functools.cache
def setup(name: str):
    """(model, params, prompt int32[2, 5]) for one of CONFIGS, built once per test session.

    Params are shaped as init's, drawn with numpy (no RNG kernels to compile), wide enough
    (std 0.5) that greedy continuations vary.
    """
    with configuration(CONFIGS[name]):
        model = configure(GPT)
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(0, 64, (2, 5)), jnp.int32)
    abstract = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), prompt))["params"]
    params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.5, s.shape), s.dtype), abstract)
    return model, params, prompt


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_equals_repeated_argmax_of_full_forward_passes(name):
    model, params, prompt = setup(name)
    # one full pass over a fixed-length window; causality makes the padding after i irrelevant to i
    logits = jax.jit(lambda tokens: model.apply({"params": params}, tokens))
    expected = jnp.zeros((2, 13), jnp.int32).at[:, :5].set(prompt)
    for i in range(5, 13):
        expected = expected.at[:, i].set(logits(expected)[:, i - 1].argmax(-1))
    out = generate(model, params, prompt, max_new_tokens=8, temperature=0.0)
    assert out.shape == (2, 13) and out.dtype == jnp.int32
    np.testing.assert_array_equal(out, expected)
    assert len(set(np.asarray(out[:, 5:]).ravel().tolist())) > 1  # not a degenerate repeat


def test_cached_chunks_give_the_logits_of_one_full_pass():
    model, params, _ = setup("llama")
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 64, (2, 12)), jnp.int32)
    full = jax.jit(model.apply)({"params": params}, tokens)
    decoder = model.clone(decode=True)
    shapes = jax.eval_shape(decoder.init, jax.random.key(0), tokens)["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    step = jax.jit(lambda cache, chunk: decoder.apply({"params": params, "cache": cache}, chunk, mutable=["cache"]))
    chunks = []
    for start, stop in [(0, 5), (5, 6), (6, 7), (7, 12)]:
        logits, variables = step(cache, tokens[:, start:stop])
        cache = variables["cache"]
        chunks.append(logits)
    np.testing.assert_allclose(jnp.concatenate(chunks, axis=1), full, atol=1e-4)


def test_sampling_compiles_once_per_shape_and_follows_the_rng():
    model, params, prompt = setup("gpt2")
    def sample(temperature, seed):
        return generate(model, params, prompt, 6, temperature=temperature, top_k=10, rng=jax.random.key(seed))

    first = sample(0.8, 3)
    compiled = generation._generate._cache_size()
    again, other = sample(1.3, 3), sample(0.8, 4)
    assert generation._generate._cache_size() == compiled
    np.testing.assert_array_equal(first, sample(0.8, 3))
    assert not np.array_equal(first, other) and not np.array_equal(first, again)
    assert ((first >= 0) & (first < 64)).all()
    np.testing.assert_array_equal(first[:, :5], prompt)


def test_top_1_sampling_is_greedy():
    model, params, prompt = setup("gpt2")
    greedy = generate(model, params, prompt, 8, temperature=0.0)  # the program the greedy test compiled
    top_1 = generate(model, params, prompt, 8, temperature=2.0, top_k=1, rng=jax.random.key(5))
    np.testing.assert_array_equal(top_1, greedy)


def windowed_reference(model, params, prompt, n):
    """Greedy tokens by nanoGPT's rule, without a cache: each new token is the argmax of a full
    forward pass over the last seq_len tokens (a shorter sequence padded at its end, which
    causality makes irrelevant to its last real position)."""
    logits = jax.jit(lambda window: model.apply({"params": params}, window))
    tokens = np.asarray(prompt)
    for _ in range(n):
        window = tokens[:, -model.seq_len:]
        last = window.shape[1] - 1
        padded = np.pad(window, ((0, 0), (0, model.seq_len - window.shape[1])))
        tokens = np.concatenate([tokens, np.asarray(logits(padded)[:, last].argmax(-1))[:, None]], axis=1)
    return tokens


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama"])  # learned positions and rotary ones
@pytest.mark.parametrize("prompt_len", [5, 16, 20])  # shorter than, as long as, and longer than the context
def test_past_the_context_the_window_keeps_the_last_seq_len_tokens(name, prompt_len):
    model, params, _ = setup(name)
    prompt = jnp.asarray(np.random.default_rng(4).integers(0, 64, (2, prompt_len)), jnp.int32)
    out = generate(model, params, prompt, max_new_tokens=30, temperature=0.0)  # seq_len 16
    assert out.shape == (2, prompt_len + 30)
    np.testing.assert_array_equal(out, windowed_reference(model, params, prompt, 30))
    assert len(set(np.asarray(out[:, prompt_len:]).ravel().tolist())) > 1  # not a degenerate repeat


def test_sample_text_continues_a_prompt():
    model, params, _ = setup("bytes")
    encode, decode = (lambda s: list(s.encode("latin-1"))), (lambda ids: bytes(ids).decode("latin-1"))
    text = sample_text(model, params, "Hello", encode, decode, 7, temperature=0.0)
    tokens = generate(model, params, jnp.asarray([encode("Hello")]), 7, temperature=0.0)
    assert text == decode(tokens[0, 5:].tolist()) and len(text) == 7


def test_ids_past_the_tokenizers_vocabulary_are_never_generated():
    """A model's vocabulary padded past the tokenizer's (64 rows, 50 ids): the padded rows made
    the likeliest (tied embeddings, so their logits dominate) are still never produced."""
    model, params, prompt = setup("gpt2")
    params = jax.tree.map(lambda x: x, params)
    params["wte"]["embedding"] = params["wte"]["embedding"].at[50:].multiply(20.0)
    unmasked = generate(model, params, prompt, max_new_tokens=8, temperature=1.0)
    assert int(unmasked[:, 5:].max()) >= 50  # without the limit the padded ids do come out
    for temperature, top_k in ((1.0, None), (2.0, 5), (0.0, None)):
        out = generate(model, params, prompt, max_new_tokens=8, temperature=temperature, top_k=top_k, vocab_size=50)
        assert int(out[:, 5:].max()) < 50 and int(out[:, 5:].min()) >= 0
    with pytest.raises(ValueError, match="vocab_size must be between 1 and the model's architecture.vocab_size"):
        generate(model, params, prompt, max_new_tokens=2, vocab_size=65)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama"])  # rotary positions: a row's position is its own
def test_prompts_of_different_lengths_continue_as_each_would_alone(name):
    """Greedy: each row of a ragged batch equals generate() on that row alone; sampled: a row's
    draws follow its own key, whatever rows sit beside it."""
    model, params, _ = setup(name)
    rows = [np.arange(1, 1 + n) % model.vocab_size for n in (9, 3, 6)]
    padded = np.zeros((3, 9), np.int32)
    for i, row in enumerate(rows):
        padded[i, :len(row)] = row
    greedy = continue_prompts(model, params, padded, [9, 3, 6], 5, temperature=0.0)
    for i, row in enumerate(rows):
        alone = generate(model, params, jnp.asarray([row]), 5, temperature=0.0)[0, len(row):]
        np.testing.assert_array_equal(greedy[i], alone)
    keys = jax.vmap(jax.random.key)(jnp.arange(3) + 7)
    sampled = continue_prompts(model, params, padded, [9, 3, 6], 5, temperature=1.0, rngs=keys)
    for i in range(3):
        alone = continue_prompts(model, params, padded[i:i + 1, :len(rows[i])], [len(rows[i])], 5, temperature=1.0,
                                 rngs=keys[i:i + 1])
        np.testing.assert_array_equal(sampled[i], alone[0])
    assert not np.array_equal(sampled, greedy)
    cold = continue_prompts(model, params, padded, [9, 3, 6], 5, temperature=1e-6, rngs=keys)
    np.testing.assert_array_equal(cold, greedy)  # temperature -> 0 is greedy


@pytest.mark.slow
def test_first_draws_follow_the_models_softmax():
    """4096 draws of the token after one prompt: their frequencies are softmax(logits / T)."""
    model, params, prompt = setup("gpt2")
    temperature, n = 0.7, 4096
    logits = model.apply({"params": params}, prompt[:1])[0, -1]
    probs = np.asarray(jax.nn.softmax(logits / temperature))
    tokens = np.broadcast_to(np.asarray(prompt[:1]), (n, prompt.shape[1]))
    drawn = continue_prompts(model, params, tokens, [prompt.shape[1]] * n, 1, temperature=temperature,
                             rngs=jax.vmap(jax.random.key)(jnp.arange(n)))
    freq = np.bincount(np.asarray(drawn[:, 0]), minlength=model.vocab_size) / n
    assert np.abs(freq - probs).max() < 4 * np.sqrt(probs.max() / n)  # 4 standard errors of the likeliest
    assert 0.5 * np.abs(freq - probs).sum() < 0.06  # total variation
