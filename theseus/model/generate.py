"""Autoregressive generation with a KV cache.

    tokens = generate(model, params, prompt, max_new_tokens=200, temperature=0.8, top_k=50, rng=key)

The prompt runs through the model once, filling the cache; each new token then runs alone.
The whole loop is one compiled program per (model, shapes, top_k).

Hook for ``python -m theseus.sample`` (it comes with checkpoints): compose the run's config,
``configure(GPT, vocab_size=...)`` under it, restore ``params`` from the checkpoint, and call
``sample_text(model, params, prompt, tokenizer.encode, tokenizer.decode, max_new_tokens, ...)``.
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
    if prompt.shape[1] + max_new_tokens > model.seq_len:
        raise ValueError(
            f"prompt ({prompt.shape[1]}) + max_new_tokens ({max_new_tokens}) exceeds "
            f"architecture.seq_len ({model.seq_len})"
        )
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
    decoder = model.clone(decode=True)
    batch, length = prompt.shape[0], prompt.shape[1] + max_new_tokens
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

    keys = jax.random.split(rng, max_new_tokens)
    cache, logits = forward(cache, prompt)
    first = _sample(logits, keys[0], temperature, top_k)
    _, rest = jax.lax.scan(step, (cache, first), keys[1:])  # rest: [max_new_tokens - 1, batch]
    return jnp.concatenate([prompt, first[:, None], rest.T], axis=1)


def _sample(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_k: int | None) -> jax.Array:
    """``int32[batch]`` from ``logits: [batch, vocab]``: argmax at temperature 0, else a draw
    from softmax(logits / temperature) over the top_k likeliest."""
    logits = logits.astype(jnp.float32)
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    drawn = jax.random.categorical(key, logits / jnp.where(temperature > 0, temperature, 1.0))
    return jnp.where(temperature > 0, drawn, jnp.argmax(logits, axis=-1)).astype(jnp.int32)
