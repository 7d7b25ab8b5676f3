"""Batched autoregressive generation with a KV cache: theseus.sample, evaluation and GRPO's rollouts.

    out = complete(model, params, prompts, lengths, max_new_tokens=64, sampling=Sampling(0.7, top_p=0.9),
                   keys=keys, stop_tokens=[eos, end_of_turn], logprobs=True)
    out.tokens    # int32[batch, max_new_tokens]: row i's completion, 0 after its end
    out.lengths   # int32[batch]: its tokens, the stop token included (TRL's completion mask)
    out.mask      # bool[batch, max_new_tokens]
    out.logprobs  # float32[batch, max_new_tokens]: each chosen token's (theseus.model.sampling), 0 after the end

    tokens = generate(model, params, prompt, max_new_tokens=200, temperature=0.8, top_k=50, rng=key)

``prompts: int[batch, width]`` is right-padded: row i's prompt is its first ``lengths[i]`` tokens.
The rows run in lockstep, each as it would alone: its own positions, its own key (its token t is
drawn with ``split(keys[i], max_new_tokens)[t]``), no padding ever attended. Two compiled
programs do the work, each compiled once per batch size, prompt width and budget (the width and
the cache length rounded up to powers of two, so that nearby widths, a conversation's turns,
share them; a caller that pads its prompts to one width, as a training step does, compiles once):

- prefill: every prompt position but each row's last through the model at once, filling the
  KV cache (its logits unused, the output head is left out of the program); with ``group``, once
  for each run of a prompt's copies (GRPO's generations), whose rows then share its cache;
- decode: a ``lax.while_loop`` that feeds each row's last token at the row's own position and
  chooses the next, until a given step or until every row has chosen a stop token (checked
  on the device, no host round trip). It runs once for the whole budget, or a chunk of steps
  a call to stream them (``on_tokens``).

Past the context (a row's sequence longer than ``architecture.seq_len``), each token is drawn
from the last ``seq_len`` tokens alone, as nanoGPT's sample.py does: the window shifts, so every
position changes (learned and rotary positions alike) and the window is recomputed whole, a
full forward pass a token (a third program, compiled when a generation goes that far).

The programs are traced under the caller's mesh and logical-axis rules (``jax.set_mesh``,
``nn.logical_axis_rules``): params stay where they are, and the cache and the outputs are laid
out as the batch is, so that GRPO samples on its training mesh with its current params.

The model: a GPT, or any module with ``seq_len`` and ``vocab_size`` fields and a ``decode``
one that, true, keeps its keys and values in ``theseus.model.layers.KVCache``s (collection
``cache``, created at the width of the first chunk, then ``grown``) and the position each row
writes next in the collection's ``index`` (``int32[batch]``; theseus sets it after the prefill).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from theseus.model.layers import grown
from theseus.model.sampling import Sampling, choose

SMALLEST = 16  # the least prompt width and cache length compiled for (powers of two above it)


class Completions(NamedTuple):
    """What ``complete`` returns; ``logprobs`` is None unless asked for."""

    tokens: jax.Array  # int32[batch, max_new_tokens], 0 after each row's end
    lengths: jax.Array  # int32[batch]: each row's tokens, its stop token included
    logprobs: jax.Array | None  # float32[batch, max_new_tokens], 0 after each row's end

    @property
    def mask(self) -> jax.Array:
        """``bool[batch, max_new_tokens]``: the tokens of each completion."""
        return jnp.arange(self.tokens.shape[1]) < self.lengths[:, None]


class _State(NamedTuple):
    """The decode loop's carry (``batch`` rows, ``new`` = max_new_tokens)."""

    cache: Any  # the model's cache collection
    keys: jax.Array  # key[batch, new]: row i's key of token t at [i, t]
    fed: jax.Array  # int32[batch]: the token each row feeds next (its last)
    tokens: jax.Array  # int32[batch, new]
    logprobs: jax.Array  # float32[batch, new] (float32[batch, 0] when not asked for)
    lengths: jax.Array  # int32[batch]: tokens chosen so far, the stop token included
    done: jax.Array  # bool[batch]: a stop token chosen
    step: jax.Array  # int32: the steps taken (the index of the next token)


class _Choice(NamedTuple):
    """How every step chooses (traced: one program serves every value)."""

    stop: jax.Array  # bool[vocab_size]: the stop tokens
    temperature: jax.Array  # float32
    top_p: jax.Array | None  # float32, None: no nucleus


def complete(model: nn.Module, params: Any, prompts: Any, lengths: Any, max_new_tokens: int,
             sampling: Sampling = Sampling(), *, keys: jax.Array | None = None, stop_tokens: Sequence[int] = (),
             vocab_size: int | None = None, logprobs: bool = False, chunk: int | None = None,
             on_tokens: Callable[[np.ndarray], None] | None = None, group: int = 1) -> Completions:
    """Continue each row of ``prompts: int[batch, width]`` (row i's prompt: its first
    ``lengths[i]`` tokens, the rest any padding) by up to ``max_new_tokens`` tokens, a row
    ending at its first of ``stop_tokens``; see the module.

    ``sampling``: temperature, top_k, top_p (``theseus.model.sampling``); ``keys: key[batch]``,
    row i's draws come from ``keys[i]`` alone (default ``jax.random.key(i)``); ``vocab_size``:
    the tokenizer's vocabulary, the ids at or above it (a model's vocabulary padded past the
    tokenizer's) never chosen (default: the model's); ``logprobs``: also each chosen token's
    log-probability. ``on_tokens``: called on the host after every ``chunk`` steps (default 1)
    with ``int32[batch, n]``, the tokens those steps chose (0 after a row's end), to stream
    them; without it the budget runs in one call and nothing waits for the device. ``group``:
    the rows come in runs of ``group`` copies of one prompt (GRPO's generations of a prompt, as
    its rollout lays them out), whose prefill is computed once a run, its first row's, and copied
    (a ``group``-th of the prefill's work; each copy then draws from its own key).
    ValueError for an argument out of range, or rows of a run that differ (a host array's).
    """
    vocab_size = _vocab_size(model, vocab_size)
    sampling.check(vocab_size)
    # host arrays stay on the host until the programs take them (no eager op compiled for them)
    prompts = prompts if isinstance(prompts, jax.Array) else np.asarray(prompts, np.int32)
    lengths = lengths if isinstance(lengths, jax.Array) else np.asarray(lengths, np.int32)
    batch = prompts.shape[0]
    if prompts.ndim != 2 or lengths.shape != (batch,) or prompts.shape[1] < 1:
        raise ValueError(f"prompts must be [batch, width] with one length a row, got {prompts.shape} and "
                         f"{lengths.shape}")
    longest, shortest = int(lengths.max()), int(lengths.min())
    if shortest < 1 or longest > prompts.shape[1]:
        raise ValueError(f"each prompt length must be between 1 and the width {prompts.shape[1]}, got "
                         f"{shortest} .. {longest}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    _check_group(prompts, lengths, group)
    stop = np.zeros(vocab_size, bool)
    for token in stop_tokens:
        if not 0 <= token < vocab_size:
            raise ValueError(f"stop token {token} is outside the vocabulary (0..{vocab_size - 1})")
        stop[token] = True
    choice = _Choice(stop, np.float32(sampling.temperature),
                     None if sampling.nucleus is None else np.float32(sampling.nucleus))
    static = {"model": model, "top_k": sampling.top_k, "vocab_size": vocab_size}

    if prompts.shape[1] > model.seq_len:  # each row's last seq_len tokens: the window its first token is drawn from
        prompts, lengths = _last_window(prompts, lengths, model.seq_len), lengths.clip(max=model.seq_len)
        longest = min(longest, model.seq_len)
    # the shapes follow the caller's width, not the lengths in it: one program for every batch of a width
    width = prompts.shape[1]
    cache_len = min(model.seq_len, _bucket(width + max_new_tokens - 1))
    state = _prefill(params, prompts, lengths, keys, model=model, width=min(_bucket(width - 1), cache_len),
                     cache_len=cache_len, new=max_new_tokens, logprobs=logprobs, group=group)
    cached = min(max_new_tokens, cache_len - longest + 1)  # the steps whose fed positions fit the cache
    if on_tokens is None and cached == max_new_tokens:
        state = _decode(params, state, choice, np.int32(max_new_tokens), **static)
    else:
        step, chunk = 0, chunk or (1 if on_tokens else max_new_tokens)
        while step < max_new_tokens:
            run = _decode if step < cached else functools.partial(_windowed, prompts=prompts, lengths=lengths)
            until = min(step + chunk, cached if step < cached else max_new_tokens)
            state = run(params, state, choice, np.int32(until), **static)
            done = int(state.step)
            if on_tokens is not None:
                on_tokens(np.asarray(state.tokens)[:, step:done])
            if done < until or np.asarray(state.done).all():  # every row has ended
                break
            step = done
    return Completions(state.tokens, state.lengths, state.logprobs if logprobs else None)


def generate(model: nn.Module, params: Any, prompt_tokens: Any, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, rng: jax.Array | None = None, vocab_size: int | None = None,
             top_p: float | None = None) -> jax.Array:
    """``prompt_tokens: int[batch, prompt] -> int32[batch, prompt + max_new_tokens]``: every row
    continued by ``complete`` (no stop token), row i's draws keyed by ``split(rng, batch)[i]``
    (``rng`` defaults to ``jax.random.key(0)``). ``model``: a GPT; ``params``: its parameter
    tree (``variables["params"]``); temperature 0 takes the argmax."""
    prompt = jnp.asarray(prompt_tokens, jnp.int32)
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt_tokens must be [batch, prompt] with at least one token, got shape {prompt.shape}")
    batch = prompt.shape[0]
    keys = jax.random.split(jax.random.key(0) if rng is None else rng, batch)
    out = complete(model, params, prompt, jnp.full((batch,), prompt.shape[1]), max_new_tokens,
                   Sampling(temperature, top_k, top_p), keys=keys, vocab_size=vocab_size)
    return jnp.concatenate([prompt, out.tokens], axis=1)


def _vocab_size(model: nn.Module, vocab_size: int | None) -> int:
    if vocab_size is None:
        return model.vocab_size
    if not 1 <= vocab_size <= model.vocab_size:
        raise ValueError(f"vocab_size must be between 1 and the model's architecture.vocab_size "
                         f"({model.vocab_size}), got {vocab_size}")
    return vocab_size


def _check_group(prompts: Any, lengths: Any, group: int) -> None:
    """ValueError unless ``group`` divides the batch and, for host arrays, each run of ``group``
    rows holds one prompt (device arrays are taken as the caller laid them out)."""
    batch = prompts.shape[0]
    if group < 1 or batch % group:
        raise ValueError(f"group must be a positive divisor of the batch ({batch} rows), got {group}")
    if group > 1 and isinstance(prompts, np.ndarray) and isinstance(lengths, np.ndarray):
        runs, run_lengths = prompts.reshape(batch // group, group, -1), lengths.reshape(-1, group)
        positions = np.arange(prompts.shape[1]) < run_lengths[..., None]
        if (run_lengths != run_lengths[:, :1]).any() or (positions & (runs != runs[:, :1])).any():
            raise ValueError(f"group={group}: each run of {group} consecutive rows must hold one prompt")


def _bucket(n: int) -> int:
    """The power of two at or above ``n`` (at least SMALLEST): few compiled shapes."""
    return max(SMALLEST, 1 << max(n - 1, 0).bit_length())


@functools.partial(jax.jit, static_argnames=("size",))
def _last_window(prompts: jax.Array, lengths: jax.Array, size: int) -> jax.Array:
    """``int32[batch, size]``: each row's last ``min(size, length)`` prompt tokens, from position 0."""
    start = jnp.maximum(lengths - size, 0)[:, None]
    return jnp.take_along_axis(prompts, jnp.minimum(start + jnp.arange(size), prompts.shape[1] - 1), axis=1)


@functools.partial(jax.jit, static_argnames=("model", "width", "cache_len", "new", "logprobs", "group"))
def _prefill(params, prompts, lengths, keys, *, model, width, cache_len, new, logprobs, group) -> _State:
    """The loop's first state: the prompts' first ``width`` positions in a KV cache of
    ``cache_len`` positions, each row's index set to its last prompt position, which it feeds
    first (what the prefill wrote there and after is written again); ``keys: key[batch]`` (None:
    ``key(i)`` for row i) split into each row's key of each token. The model runs on every
    ``group``-th row, each run's first, whose cache its run's rows copy."""
    batch = prompts.shape[0]
    chunk = jnp.pad(prompts[::group], ((0, 0), (0, max(0, width - prompts.shape[1]))))[:, :width]
    # the chunk creates the cache at its own width (one trace of the model, no init's)
    cache = model.clone(decode=True).apply({"params": params}, chunk, mutable=["cache"])[1]["cache"]
    cache = jax.tree.map(lambda x: jnp.repeat(x, group, axis=0) if x.ndim else x, grown(cache, cache_len))
    cache = {**cache, "index": lengths - 1}
    keys = jax.vmap(jax.random.key)(jnp.arange(batch)) if keys is None else keys
    fed = jnp.take_along_axis(prompts, lengths[:, None] - 1, axis=1)[:, 0]
    return _State(cache, jax.vmap(lambda key: jax.random.split(key, new))(keys), fed,
                  jnp.zeros((batch, new), jnp.int32), jnp.zeros((batch, new if logprobs else 0)),
                  jnp.zeros(batch, jnp.int32), jnp.zeros(batch, bool), jnp.int32(0))


@functools.partial(jax.jit, static_argnames=("model", "top_k", "vocab_size"), donate_argnames=("state",))
def _decode(params, state: _State, choice: _Choice, until: jax.Array, *, model, top_k, vocab_size) -> _State:
    """Steps through the cache until step ``until`` or every row's end."""
    decoder = model.clone(decode=True)

    def step(state: _State) -> _State:
        logits, variables = decoder.apply({"params": params, "cache": state.cache}, state.fed[:, None],
                                          mutable=["cache"])
        return _chosen(state._replace(cache=variables["cache"]), logits[:, -1, :vocab_size], choice, top_k)

    return jax.lax.while_loop(lambda state: _going(state, until), step, state)


@functools.partial(jax.jit, static_argnames=("model", "top_k", "vocab_size"), donate_argnames=("state",))
def _windowed(params, state: _State, choice: _Choice, until: jax.Array, *, prompts, lengths, model, top_k,
              vocab_size) -> _State:
    """Steps without the cache until step ``until`` or every row's end: each row's token from a
    full forward pass over its last ``seq_len`` tokens (positions 0 .. seq_len - 1)."""
    size, width, new = model.seq_len, prompts.shape[1], state.tokens.shape[1]

    def step(state: _State) -> _State:
        seen = lengths + state.step  # [batch]: each row's tokens so far, prompt and chosen
        at = jnp.maximum(seen - size, 0)[:, None] + jnp.arange(size)  # [batch, size]: the window's positions
        window = jnp.where(at < lengths[:, None],
                           jnp.take_along_axis(prompts, jnp.minimum(at, width - 1), axis=1),
                           jnp.take_along_axis(state.tokens, jnp.clip(at - lengths[:, None], 0, new - 1), axis=1))
        logits = model.apply({"params": params}, window)  # a shorter row's padding: after its last position
        last = jnp.take_along_axis(logits, jnp.minimum(seen, size)[:, None, None] - 1, axis=1)[:, 0, :vocab_size]
        return _chosen(state, last, choice, top_k)

    return jax.lax.while_loop(lambda state: _going(state, until), step, state)


def _going(state: _State, until: jax.Array) -> jax.Array:
    return (state.step < until) & ~jnp.all(state.done)


def _chosen(state: _State, logits: jax.Array, choice: _Choice, top_k: int | None) -> _State:
    """``state`` after each row still going chooses its token ``state.step`` from ``logits:
    [batch, vocab_size]`` (an ended row writes nothing)."""
    t = state.step
    tokens, logps = choose(logits, jax.lax.dynamic_index_in_dim(state.keys, t, axis=1, keepdims=False),
                           choice.temperature, top_k, choice.top_p)
    going = ~state.done
    tokens = jnp.where(going, tokens, 0)
    logprobs = state.logprobs
    if logprobs.shape[1]:
        logprobs = jax.lax.dynamic_update_index_in_dim(logprobs, jnp.where(going, logps, 0.0), t, axis=1)
    return _State(state.cache, state.keys, tokens, jax.lax.dynamic_update_index_in_dim(state.tokens, tokens, t, axis=1),
                  logprobs, state.lengths + going, state.done | (going & choice.stop[tokens]), t + 1)
