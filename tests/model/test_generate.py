"""complete() and generate(): the KV cache reproduces full forward passes, past the context too (a
sliding window of seq_len tokens); rows of different lengths continue as each would alone; a row
ends at its first stop token; the log-probs are the model's; one compilation per shape."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import configuration, configure
from theseus.model import generate as generation
from theseus.model.generate import complete, generate
from theseus.model.models.gpt import GPT
from theseus.model.sampling import Sampling

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
    "long": {  # a context the tests below do not run past
        **TINY, "architecture.seq_len": 64, "architecture.positions": "rope", "architecture.n_kv_heads": 2,
    },
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


def ragged(lengths, vocab=64, seed=0) -> tuple[list[np.ndarray], np.ndarray]:
    """Prompts of ``lengths`` and their right-padded batch (padding: ids that are not 0)."""
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, vocab, n) for n in lengths]
    padded = rng.integers(1, vocab, (len(rows), max(lengths))).astype(np.int32)
    for i, row in enumerate(rows):
        padded[i, :len(row)] = row
    return rows, padded


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
    """One index for every row (init's) and one per row, each row at its own offset."""
    model, params, _ = setup("llama")
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 64, (2, 12)), jnp.int32)
    full = jax.jit(model.apply)({"params": params}, tokens)
    decoder = model.clone(decode=True)
    shapes = jax.eval_shape(decoder.init, jax.random.key(0), tokens)["cache"]
    empty = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    step = jax.jit(lambda cache, chunk: decoder.apply({"params": params, "cache": cache}, chunk, mutable=["cache"]))
    cache, chunks = empty, []
    for start, stop in [(0, 5), (5, 6), (6, 7), (7, 12)]:
        logits, variables = step(cache, tokens[:, start:stop])
        cache = variables["cache"]
        chunks.append(logits)
    np.testing.assert_allclose(jnp.concatenate(chunks, axis=1), full, atol=1e-4)

    # row 0 has cached 7 positions and row 1 only 4: one chunk continues each from its own
    _, variables = step(empty, tokens[:, :7])
    cache = {**variables["cache"], "index": jnp.asarray([7, 4])}
    logits, _ = step(cache, jnp.stack([tokens[0, 7:10], tokens[1, 4:7]]))
    np.testing.assert_allclose(logits[0], full[0, 7:10], atol=1e-4)
    np.testing.assert_allclose(logits[1], full[1, 4:7], atol=1e-4)


def test_one_compilation_serves_every_sampling_setting_seed_and_nearby_prompt_length():
    model, params, _ = setup("long")
    rows, padded = ragged([5, 9, 7])

    def sample(lengths, temperature, seed, top_p=0.9):
        return complete(model, params, padded, lengths, 6, Sampling(temperature, 10, top_p),
                        keys=jax.random.split(jax.random.key(seed), 3)).tokens

    first = sample([5, 9, 7], 0.8, 3)
    compiled = generation._prefill._cache_size(), generation._decode._cache_size()
    again, other, greedy = sample([5, 9, 7], 1.3, 3, 0.5), sample([5, 9, 7], 0.8, 4), sample([5, 9, 7], 0.0, 3)
    shorter = sample([3, 8, 6], 0.8, 3)  # the same buckets: prompt width 16, cache 16
    assert (generation._prefill._cache_size(), generation._decode._cache_size()) == compiled
    np.testing.assert_array_equal(first, sample([5, 9, 7], 0.8, 3))
    assert not np.array_equal(first, other) and not np.array_equal(first, again)
    assert not np.array_equal(first, greedy) and not np.array_equal(first, shorter)
    assert ((first >= 0) & (first < 64)).all()


def test_top_1_and_top_p_0_sampling_are_greedy():
    model, params, prompt = setup("gpt2")
    greedy = generate(model, params, prompt, 8, temperature=0.0)
    np.testing.assert_array_equal(generate(model, params, prompt, 8, temperature=2.0, top_k=1, rng=jax.random.key(5)),
                                  greedy)
    np.testing.assert_array_equal(generate(model, params, prompt, 8, temperature=2.0, top_p=0.0, rng=jax.random.key(5)),
                                  greedy)


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


@pytest.mark.slow
def test_past_the_context_rows_of_different_lengths_each_keep_their_own_window():
    model, params, _ = setup("llama")
    rows, padded = ragged([20, 3, 11], seed=6)
    out = complete(model, params, padded, [20, 3, 11], 18, Sampling(0.0))
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(out.tokens[i], windowed_reference(model, params, row[None], 18)[0, len(row):])


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


@pytest.mark.parametrize("name", ["gpt2", "llama"])  # learned positions and rotary ones: a row's are its own
def test_prompts_of_different_lengths_continue_as_each_would_alone(name):
    """Greedy: each row of a ragged batch equals generate() on that row alone; sampled: a row's
    draws follow its own key, whatever rows sit beside it."""
    model, params, _ = setup(name)
    rows, padded = ragged([9, 3, 6])
    greedy = complete(model, params, padded, [9, 3, 6], 5, Sampling(0.0)).tokens
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(greedy[i], generate(model, params, row[None], 5, temperature=0.0)[0, len(row):])
    keys = jax.vmap(jax.random.key)(jnp.arange(3) + 7)
    sampled = complete(model, params, padded, [9, 3, 6], 5, Sampling(1.0), keys=keys).tokens
    for i, row in enumerate(rows):
        alone = complete(model, params, row[None], [len(row)], 5, Sampling(1.0), keys=keys[i:i + 1]).tokens
        np.testing.assert_array_equal(sampled[i], alone[0])
    assert not np.array_equal(sampled, greedy)
    cold = complete(model, params, padded, [9, 3, 6], 5, Sampling(1e-6), keys=keys).tokens
    np.testing.assert_array_equal(cold, greedy)  # temperature -> 0 is greedy


def test_a_group_of_copies_prefilled_once_continues_as_each_copy_prefilled_alone():
    """``group=3`` (GRPO's generations of a prompt): runs of 3 copies of a ragged batch's prompts,
    each run's prefill computed once, sample the same tokens, lengths and log-probs, each copy
    from its own key, as every row prefilled on its own (``group=1``)."""
    model, params, _ = setup("llama")
    _, padded = ragged([9, 4])
    copies, lengths = np.repeat(padded, 3, axis=0), np.repeat([9, 4], 3)
    keys = jax.vmap(jax.random.key)(jnp.arange(6) + 3)
    alone, grouped = (complete(model, params, copies, lengths, 6, Sampling(1.0), keys=keys, stop_tokens=[5],
                               logprobs=True, group=group) for group in (1, 3))
    np.testing.assert_array_equal(grouped.tokens, alone.tokens)
    np.testing.assert_array_equal(grouped.lengths, alone.lengths)
    np.testing.assert_allclose(grouped.logprobs, alone.logprobs, atol=1e-6)
    assert len({tuple(row) for row in np.asarray(alone.tokens[:3])}) > 1  # the copies drew apart


@pytest.mark.slow
def test_rows_end_at_their_first_stop_token_with_the_models_log_probs():
    """Sampled rows (temperature 0.7, top-k 20): each ends at its first stop token (counted in
    its length; 0s after it), draws what it draws without stop tokens up to there, and its
    log-probs are log_softmax(logits / 0.7) of a full forward pass over prompt + completion."""
    model, params, _ = setup("long")
    rows, padded = ragged([7, 4, 10, 5], seed=1)
    keys, sampling = jax.random.split(jax.random.key(1), 4), Sampling(0.7, top_k=20)
    free = complete(model, params, padded, [7, 4, 10, 5], 24, sampling, keys=keys, logprobs=True)
    stops = [int(free.tokens[0, 3]), int(free.tokens[2, 9])]  # rows 0 and 2 end by then, the others may
    out = complete(model, params, padded, [7, 4, 10, 5], 24, sampling, keys=keys, stop_tokens=stops, logprobs=True)
    tokens, lengths, logps = np.asarray(out.tokens), np.asarray(out.lengths), np.asarray(out.logprobs)
    np.testing.assert_array_equal(out.mask, np.arange(24) < lengths[:, None])
    assert lengths[0] <= 4 and lengths[2] <= 10 and min(lengths) < 24
    forward = jax.jit(lambda t: jax.nn.log_softmax(model.apply({"params": params}, t) / 0.7, axis=-1))
    for i, row in enumerate(rows):
        n = lengths[i]
        np.testing.assert_array_equal(tokens[i, :n], free.tokens[i, :n])
        assert all(t not in stops for t in tokens[i, :n - 1]) and (n == 24 or tokens[i, n - 1] in stops)
        assert not tokens[i, n:].any() and not logps[i, n:].any()
        sequence = np.concatenate([row, tokens[i, :n]])[None]
        expected = np.take_along_axis(np.asarray(forward(sequence))[0, len(row) - 1:-1], tokens[i, :n, None], 1)[:, 0]
        np.testing.assert_allclose(logps[i, :n], expected, atol=2e-5)


def test_streamed_chunks_are_the_completions_and_stop_when_every_row_has_ended():
    model, params, _ = setup("long")
    rows, padded = ragged([6, 2], seed=3)
    whole = complete(model, params, padded, [6, 2], 20, Sampling(0.0)).tokens
    stops = sorted({int(whole[0, 2]), int(whole[1, 4])})  # row 0 ends by its 3rd token, row 1 by its 5th
    for chunk in (1, 3):
        chunks = []
        out = complete(model, params, padded, [6, 2], 20, Sampling(0.0), stop_tokens=stops, chunk=chunk,
                       on_tokens=chunks.append)
        streamed = np.concatenate(chunks, axis=1)
        assert streamed.shape[1] == int(max(out.lengths)) <= 5  # no step after every row's end
        assert len(chunks) == -(-streamed.shape[1] // chunk)
        np.testing.assert_array_equal(streamed, out.tokens[:, :streamed.shape[1]])
        np.testing.assert_array_equal(out.tokens * out.mask, whole * out.mask)


def test_bad_arguments_are_refused():
    model, params, prompt = setup("gpt2")
    for kwargs, match in [({"sampling": Sampling(top_k=65)}, "top_k must be between 1 and the vocabulary size"),
                          ({"sampling": Sampling(top_p=1.5)}, "top_p must be between 0 and 1"),
                          ({"sampling": Sampling(temperature=-1)}, "temperature must be 0"),
                          ({"stop_tokens": [64]}, "stop token 64 is outside the vocabulary"),
                          ({"lengths": [0, 5]}, "each prompt length must be between 1 and the width 5"),
                          ({"max_new_tokens": 0}, "max_new_tokens must be at least 1"),
                          ({"group": 3}, "group must be a positive divisor of the batch \\(2 rows\\), got 3"),
                          ({"group": 2}, "group=2: each run of 2 consecutive rows must hold one prompt")]:
        args = {"lengths": [5, 5], "max_new_tokens": 4, **kwargs}
        with pytest.raises(ValueError, match=match):
            complete(model, params, np.asarray(prompt), **args)


@pytest.mark.slow
def test_first_draws_follow_the_models_softmax():
    """4096 draws of the token after one prompt: their frequencies are softmax(logits / T)."""
    model, params, prompt = setup("gpt2")
    temperature, n = 0.7, 4096
    logits = model.apply({"params": params}, prompt[:1])[0, -1]
    probs = np.asarray(jax.nn.softmax(logits / temperature))
    tokens = np.broadcast_to(np.asarray(prompt[:1]), (n, prompt.shape[1]))
    drawn = complete(model, params, tokens, [prompt.shape[1]] * n, 1, Sampling(temperature),
                     keys=jax.vmap(jax.random.key)(jnp.arange(n))).tokens
    freq = np.bincount(np.asarray(drawn[:, 0]), minlength=model.vocab_size) / n
    assert np.abs(freq - probs).max() < 4 * np.sqrt(probs.max() / n)  # 4 standard errors of the likeliest
    assert 0.5 * np.abs(freq - probs).sum() < 0.06  # total variation


SHARDED = """
import json
import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from theseus.base.axis import BATCH_MESH_AXES, MESH_AXES
from theseus.config import configuration, configure
from theseus.model.generate import complete
from theseus.model.models.gpt import GPT
from theseus.model.sampling import Sampling

with configuration({"architecture.vocab_size": 64, "architecture.seq_len": 64, "architecture.n_layers": 2,
                    "architecture.d_model": 32, "architecture.n_heads": 4, "architecture.n_kv_heads": 2,
                    "architecture.positions": "rope", "architecture.norm": "rmsnorm", "architecture.bias": False}):
    model = configure(GPT)
boxed = model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
params = jax.tree.map(lambda x: x * 25, nn.unbox(boxed))  # init's std 0.02 x 25: varied continuations
rng = np.random.default_rng(0)
lengths = rng.integers(1, 12, 8)
prompts = rng.integers(0, 64, (8, 12)).astype(np.int32)
keys = jax.random.split(jax.random.key(1), 8)
args = (prompts, lengths, 10, Sampling(0.9, top_p=0.95))
kwargs = {"keys": keys, "stop_tokens": [3, 7], "logprobs": True}
alone = complete(model, params, *args, **kwargs)
copies = [np.repeat(x[:2], 4, axis=0) for x in (prompts, lengths)]  # GRPO's: 2 prompts x 4, fewer than the devices
copied = complete(model, params, *copies, *args[2:], **kwargs)
report = {"alone": np.asarray(alone.tokens).tolist(), "lengths": np.asarray(alone.lengths).tolist()}
for layout in ((2, 2, 1, 1), (2, 1, 1, 2)):  # data x fsdp, data x tensor
    mesh = Mesh(np.asarray(jax.devices()).reshape(layout), MESH_AXES)
    on = lambda spec: NamedSharding(mesh, spec)
    sharded = jax.tree.map(lambda x, spec: jax.device_put(x, on(spec)), params, model.sharding.specs(boxed))
    split = lambda x: jax.device_put(x, on(PartitionSpec(BATCH_MESH_AXES, *[None] * (np.ndim(x) - 1))))
    with jax.set_mesh(mesh), nn.logical_axis_rules(model.sharding.rules()):
        out = complete(model, sharded, *map(split, (prompts, lengths)), *args[2:], **{**kwargs, "keys": split(keys)})
        grouped = complete(model, sharded, *map(split, copies), *args[2:], **{**kwargs, "keys": split(keys)}, group=4)
    report[str(layout)] = {"tokens": np.asarray(out.tokens).tolist(), "lengths": np.asarray(out.lengths).tolist(),
                           "logprobs": float(np.abs(np.asarray(out.logprobs) - np.asarray(alone.logprobs)).max()),
                           "grouped": np.asarray(grouped.tokens).tolist() == np.asarray(copied.tokens).tolist(),
                           "rows_per_device": out.tokens.addressable_shards[0].data.shape[0],
                           "weights_split": sharded["wte"]["embedding"].addressable_shards[0].data.shape}
print(json.dumps(report))
"""


@pytest.mark.slow
def test_sampling_on_a_mesh_with_sharded_params_and_batch_gives_each_rows_completion():
    """GRPO's case: 4 CPU devices, params laid out by the model's plan (data x fsdp: weights split
    over fsdp; data x tensor: heads and kv heads split), the batch split over the batch axes, under
    the caller's mesh and rules: the same completions as on one device, kept split by row; and
    runs of 4 copies of 2 prompts (``group=4``, fewer runs than devices) as the copies one by one."""
    import json

    from support import run_python

    proc = run_python("-c", SHARDED, devices=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert len(set(map(tuple, report["alone"]))) > 1 and min(report["lengths"]) < 10  # varied, some stopped
    for layout, batch_ways in (("(2, 2, 1, 1)", 4), ("(2, 1, 1, 2)", 2)):
        got = report[layout]
        assert got["tokens"] == report["alone"] and got["lengths"] == report["lengths"]
        assert got["logprobs"] < 1e-4  # sharded sums round otherwise
        assert got["rows_per_device"] == 8 // batch_ways
        assert got["grouped"]
    assert report["(2, 2, 1, 1)"]["weights_split"] == [64, 16]  # embed over fsdp: no copy of the whole
    assert report["(2, 1, 1, 2)"]["weights_split"] == [32, 32]  # vocab over tensor
