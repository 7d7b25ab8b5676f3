"""Autoregressive generation with a KV cache, for any number of tokens.

    tokens = generate(model, params, prompt, max_new_tokens=200, temperature=0.8, top_k=50, rng=key)

The prompt runs through the model once, filling the cache; each new token then runs alone.
Once the context (``architecture.seq_len``) is full, each token is drawn from the last
``seq_len`` tokens alone, as nanoGPT's sample.py does: the window shifts, so every position
changes (learned and rotary positions alike) and the window is recomputed whole, a full forward
pass a token. The whole loop is one compiled program per (model, shapes, top_k).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


def generate(
    model: nn.Module,
    params,
    prompt_tokens: jax.Array,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    rng: jax.Array | None = None,
    vocab_size: int | None = None,
) -> jax.Array:
    """``prompt_tokens: int[batch, prompt] -> int32[batch, prompt + max_new_tokens]``.

    Each token is drawn from the last ``model.seq_len`` tokens before it (the prompt's included).
    ``model``: a GPT (a module with ``decode`` and ``seq_len`` fields); ``params``: its
    parameter tree (``variables["params"]``). Each token is drawn from softmax(logits /
    temperature) over the ``top_k`` likeliest (all when None); temperature 0 takes the argmax.
    ``rng`` defaults to ``jax.random.key(0)``. ``vocab_size``: the tokenizer's vocabulary; the
    ids at or above it (a model's vocabulary padded past the tokenizer's) are never produced.
    """
    prompt = jnp.asarray(prompt_tokens, jnp.int32)
    if prompt.ndim != 2:
        raise ValueError(f"prompt_tokens must be [batch, prompt], got shape {prompt.shape}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if prompt.shape[1] < 1:
        raise ValueError("the prompt must hold at least one token")
    vocab_size = model.vocab_size if vocab_size is None else vocab_size
    if not 1 <= vocab_size <= model.vocab_size:
        raise ValueError(f"vocab_size must be between 1 and the model's architecture.vocab_size "
                         f"({model.vocab_size}), got {vocab_size}")
    if top_k is not None and not 1 <= top_k <= vocab_size:
        raise ValueError(f"top_k must be between 1 and the vocabulary size ({vocab_size}), got {top_k}")
    rng = jax.random.key(0) if rng is None else rng
    return _generate(model, params, prompt, max_new_tokens, top_k, vocab_size, jnp.float32(temperature), rng)


def sample_text(
    model: nn.Module,
    params,
    prompt: str,
    encode: Callable[[str], Sequence[int]],
    decode: Callable[[list[int]], str],
    max_new_tokens: int,
    **kwargs,
) -> str:
    """The text ``generate`` continues ``prompt`` with (kwargs: temperature, top_k, rng, vocab_size)."""
    prompt_tokens = jnp.asarray([encode(prompt)], jnp.int32)
    tokens = generate(model, params, prompt_tokens, max_new_tokens, **kwargs)
    return decode(tokens[0, prompt_tokens.shape[1]:].tolist())


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "top_k", "vocab_size"))
def _generate(model, params, prompt, max_new_tokens, top_k, vocab_size, temperature, rng):
    keys = jax.random.split(rng, max_new_tokens)
    context = prompt[:, -model.seq_len:]  # what the first token is drawn from
    # cached: the tokens drawn while the window still holds everything before them
    cached = min(max_new_tokens, model.seq_len - context.shape[1] + 1)
    new = _cached(model, params, context, keys[:cached], top_k, vocab_size, temperature)
    if cached < max_new_tokens:
        window = jnp.concatenate([context, new], axis=1)[:, -model.seq_len:]
        new = jnp.concatenate([new, _windowed(model, params, window, keys[cached:], top_k, vocab_size,
                                              temperature)], axis=1)
    return jnp.concatenate([prompt, new], axis=1)


def _cached(model, params, context, keys, top_k, vocab_size, temperature):
    """``int32[batch, len(keys)]``: the tokens after ``context: [batch, prompt]`` through a KV
    cache (prompt + len(keys) - 1 <= seq_len: every token sees all those before it)."""
    decoder = model.clone(decode=True)
    batch, length = context.shape[0], context.shape[1] + len(keys) - 1
    shapes = jax.eval_shape(decoder.init, jax.random.key(0), jnp.zeros((batch, length), jnp.int32))["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def forward(cache, tokens):  # -> cache, logits of the last position over the tokenizer's ids [batch, vocab_size]
        logits, variables = decoder.apply({"params": params, "cache": cache}, tokens, mutable=["cache"])
        return variables["cache"], logits[:, -1, :vocab_size]

    def step(carry, key):
        cache, token = carry
        cache, logits = forward(cache, token[:, None])
        token = _sample(logits, key, temperature, top_k)
        return (cache, token), token

    cache, logits = forward(cache, context)
    first = _sample(logits, keys[0], temperature, top_k)
    _, rest = jax.lax.scan(step, (cache, first), keys[1:])  # rest: [len(keys) - 1, batch]
    return jnp.concatenate([first[:, None], rest.T], axis=1)


def _windowed(model, params, window, keys, top_k, vocab_size, temperature):
    """``int32[batch, len(keys)]``: the tokens after ``window: [batch, seq_len]``, each drawn
    from a full forward pass over the last seq_len tokens (positions 0 .. seq_len - 1)."""

    def step(window, key):
        logits = model.apply({"params": params}, window)[:, -1, :vocab_size]
        token = _sample(logits, key, temperature, top_k)
        return jnp.concatenate([window[:, 1:], token[:, None]], axis=1), token

    return jax.lax.scan(step, window, keys)[1].T


def _sample(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_k: int | None) -> jax.Array:
    """``int32[batch]`` from ``logits: [batch, vocab]``: argmax at temperature 0, else a draw
    from softmax(logits / temperature) over the top_k likeliest."""
    logits = logits.astype(jnp.float32)
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    drawn = jax.random.categorical(key, logits / jnp.where(temperature > 0, temperature, 1.0))
    return jnp.where(temperature > 0, drawn, jnp.argmax(logits, axis=-1)).astype(jnp.int32)
