"""Autoregressive generation with a KV cache, for any number of tokens.

    tokens = generate(model, params, prompt, max_new_tokens=200, temperature=0.8, top_k=50, rng=key)

The prompt runs through the model once, filling the cache; each new token then runs alone.
Once the context (``architecture.seq_len``) is full, each token is drawn from the last
``seq_len`` tokens alone, as nanoGPT's sample.py does: the window shifts, so every position
changes (learned and rotary positions alike) and the window is recomputed whole, a full forward
pass a token. The whole loop is one compiled program per (model, shapes, top_k).

    new = continue_prompts(model, params, padded, lengths, 20, temperature=0.0, rngs=keys)

continues a batch of prompts of different lengths (right-padded, row i's first ``lengths[i]``
tokens) at once, each row as it would be alone: every row holds real tokens at every position
(no padding is ever attended), each row reading its own prompt token where it has one and its
own draw past it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


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


def continue_prompts(
    model: nn.Module,
    params,
    tokens: np.ndarray,
    lengths: Sequence[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    rngs: jax.Array | None = None,
    vocab_size: int | None = None,
) -> jax.Array:
    """``tokens: int[batch, width]`` (row i's prompt: its first ``lengths[i]`` tokens, the rest any
    padding) ``-> int32[batch, max_new_tokens]``, the tokens after each row's prompt.

    The window holds all of them: ``width + max_new_tokens - 1 <= model.seq_len``. ``rngs``:
    ``key[batch]``, row i's draws come from ``rngs[i]`` alone, so a row's tokens do not depend
    on the rows beside it (default: ``jax.random.key(i)``). ``temperature``, ``top_k`` and
    ``vocab_size`` as ``generate``'s. Rows are run in lockstep through one KV cache: the
    shortest prompt (rounded down to a multiple of 32, few compiled shapes) fills it at once,
    then one position a step, each row reading its prompt token there or, past its prompt,
    sampling one.
    """
    tokens = np.asarray(tokens, np.int32)
    lengths = np.asarray(lengths, np.int32)
    batch, width = tokens.shape
    if lengths.shape != (batch,) or lengths.min() < 1 or lengths.max() > width:
        raise ValueError(f"lengths must be {batch} prompt lengths between 1 and {width}, got {lengths.tolist()}")
    if max_new_tokens < 1 or width + max_new_tokens - 1 > model.seq_len:
        raise ValueError(f"{width} prompt positions + {max_new_tokens} new tokens exceed the window "
                         f"(architecture.seq_len {model.seq_len})")
    vocab_size = model.vocab_size if vocab_size is None else vocab_size
    rngs = jax.vmap(jax.random.key)(jnp.arange(batch)) if rngs is None else rngs
    shortest = int(lengths.min())
    start = max(1, shortest - shortest % 32)
    keys = jax.vmap(lambda key: jax.random.split(key, max_new_tokens))(rngs)  # [batch, max_new_tokens]
    return _continue(model, params, jnp.asarray(tokens), jnp.asarray(lengths), keys, start, top_k, vocab_size,
                     jnp.float32(temperature))


@functools.partial(jax.jit, static_argnames=("model", "start", "top_k", "vocab_size"))
def _continue(model, params, tokens, lengths, keys, start, top_k, vocab_size, temperature):
    decoder = model.clone(decode=True)
    batch, width = tokens.shape
    new = keys.shape[1]
    total = width + new - 1  # the last position drawn, and the positions cached (its token is never fed)
    shapes = jax.eval_shape(decoder.init, jax.random.key(0), jnp.zeros((batch, total), jnp.int32))["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    padded = jnp.pad(tokens, ((0, 0), (0, new)))

    def forward(cache, chunk):  # -> cache, logits of the last position [batch, vocab_size]
        logits, variables = decoder.apply({"params": params, "cache": cache}, chunk, mutable=["cache"])
        return variables["cache"], logits[:, -1, :vocab_size]

    def choose(logits, position):  # int32[batch]: each row's token at ``position``, its prompt's or a draw
        drawn = jnp.clip(position - lengths, 0, new - 1)
        row_keys = jnp.take_along_axis(keys, drawn[:, None], axis=1)[:, 0]
        sampled = jax.vmap(lambda l, k: _sample(l[None], k, temperature, top_k)[0])(logits, row_keys)
        return jnp.where(position < lengths, padded[:, position], sampled)

    def step(carry, position):
        cache, logits = carry
        token = choose(logits, position)
        return forward(cache, token[:, None]), token

    cache, logits = forward(cache, tokens[:, :start])
    (_, logits), fed = jax.lax.scan(step, (cache, logits), jnp.arange(start, total))  # [total - start, batch]
    out = jnp.concatenate([fed.T, choose(logits, total)[:, None]], axis=1)  # positions start .. total
    return jnp.take_along_axis(out, lengths[:, None] - start + jnp.arange(new), axis=1)


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
