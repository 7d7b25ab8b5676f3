"""theseus.model.sampling against transformers' logits warpers: temperature, then top-k, then top-p
remove the tokens transformers removes and keep its scaled logits; a draw follows the softmax of
what remains; greedy is the argmax; the log-prob is log_softmax(logits / T) of the chosen token."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.model.sampling import Sampling, choose, warp

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def logits_batch(vocab: int = 500) -> np.ndarray:
    """float32[4, vocab]: from flat to very peaked."""
    rng = np.random.default_rng(0)
    return np.stack([rng.normal(0, scale, vocab) for scale in (1, 2, 4, 12)]).astype(np.float32)


def transformers_warped(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None) -> np.ndarray:
    """transformers' sampling warpers in the order ``generate`` builds them."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k is not None:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers(torch.zeros((len(logits), 1), dtype=torch.long), torch.from_numpy(logits.copy())).numpy()


@pytest.mark.parametrize(("temperature", "top_k", "top_p"),
                         [(1.0, 50, None), (0.7, None, 0.9), (1.3, 40, 0.5), (0.5, None, 0.0), (2.0, 3, 1.0),
                          (1.0, 1, 0.3), (0.9, None, 0.999)])
def test_warp_removes_what_transformers_removes(temperature, top_k, top_p):
    logits = logits_batch()
    expected = transformers_warped(logits, temperature, top_k, top_p)
    got = np.asarray(warp(jnp.asarray(logits), jnp.float32(temperature), top_k,
                          None if top_p is None else jnp.float32(top_p)))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    kept = ~np.isinf(expected)
    np.testing.assert_allclose(got[kept], expected[kept], rtol=1e-6)
    assert kept.sum(axis=1).min() >= 1


def test_top_p_keeps_every_token_tied_with_the_last_one_kept():
    """Probabilities 0.1, 0.2, 0.2, 0.5 at top-p 0.6: transformers removes 0.1 and one of the two
    0.2s (whichever its sort puts first); theseus keeps both."""
    logits = np.log(np.asarray([[0.2, 0.1, 0.5, 0.2]], np.float32))
    theirs = ~np.isinf(transformers_warped(logits, 1.0, None, 0.6))
    ours = ~np.isinf(np.asarray(warp(jnp.asarray(logits), jnp.float32(1.0), None, jnp.float32(0.6))))
    assert theirs.sum() == 2 and theirs[0, 2]
    np.testing.assert_array_equal(ours, [[True, False, True, True]])


def test_draws_follow_the_softmax_of_the_warped_logits_and_each_rows_own_key():
    """8192 draws of each row: their frequencies are transformers' warped distribution; a row's
    draws with its key are the same whatever rows sit beside it."""
    logits, n = logits_batch(64)[:2], 8192
    temperature, top_k, top_p = 0.8, 20, 0.9
    probs = torch.softmax(torch.from_numpy(transformers_warped(logits, temperature, top_k, top_p)), -1).numpy()
    keys = jax.random.split(jax.random.key(0), n)
    draw = jax.jit(jax.vmap(lambda key: choose(jnp.asarray(logits), jnp.stack([key, key]), jnp.float32(temperature),
                                               top_k, jnp.float32(top_p))[0]))
    tokens = np.asarray(draw(keys))  # [n, 2]: row r's n draws in column r
    for r in range(2):
        freq = np.bincount(tokens[:, r], minlength=64) / n
        assert (freq[probs[r] == 0] == 0).all()  # nothing removed is ever drawn
        assert np.abs(freq - probs[r]).max() < 4 * np.sqrt(probs[r].max() / n)
    alone, _ = choose(jnp.asarray(logits[1:]), keys[:1], jnp.float32(temperature), top_k, jnp.float32(top_p))
    paired, _ = choose(jnp.asarray(logits), jnp.stack([keys[5], keys[0]]), jnp.float32(temperature), top_k,
                       jnp.float32(top_p))
    assert int(alone[0]) == int(paired[1])


def test_greedy_is_the_argmax_and_the_log_prob_is_the_tempered_softmax():
    logits = jnp.asarray(logits_batch())
    keys = jax.random.split(jax.random.key(3), 4)
    tokens, logps = choose(logits, keys, jnp.float32(0.0), 5, jnp.float32(0.5))
    np.testing.assert_array_equal(tokens, np.argmax(logits_batch(), axis=1))
    expected = torch.log_softmax(torch.from_numpy(logits_batch()), -1).numpy()
    np.testing.assert_allclose(logps, expected[np.arange(4), tokens], rtol=1e-6)
    tokens, logps = choose(logits, keys, jnp.float32(0.6), None, None)
    expected = torch.log_softmax(torch.from_numpy(logits_batch()) / 0.6, -1).numpy()
    np.testing.assert_allclose(logps, expected[np.arange(4), tokens], rtol=1e-5)


def test_draws_are_jax_categoricals_and_ties_go_to_the_first_maximum():
    """A draw is ``jax.random.categorical``'s with the row's key (warped-out tokens at -inf
    included); greedy takes the first of tied maxima, as argmax does."""
    logits = jnp.asarray(logits_batch())
    keys = jax.random.split(jax.random.key(7), 4)
    for top_p in (None, jnp.float32(0.8)):
        tokens, _ = choose(logits, keys, jnp.float32(0.9), 30, top_p)
        expected = jax.vmap(jax.random.categorical)(keys, warp(logits, jnp.float32(0.9), 30, top_p))
        np.testing.assert_array_equal(tokens, expected)
    tied = jnp.asarray([[0.0, 3.0, 1.0, 3.0], [-jnp.inf, -1.0, -1.0, -2.0]])
    tokens, _ = choose(tied, keys[:2], jnp.float32(0.0), None, None)
    np.testing.assert_array_equal(tokens, [1, 1])


def test_settings_out_of_range_are_named():
    for sampling, match in [(Sampling(top_k=0), "top_k must be between 1 and the vocabulary size \\(10\\), got 0"),
                            (Sampling(top_p=-0.1), "top_p must be between 0 and 1, got -0.1"),
                            (Sampling(temperature=float("nan")), "temperature must be 0 \\(greedy\\) or positive")]:
        with pytest.raises(ValueError, match=match):
            sampling.check(10)
    assert Sampling(top_p=1.0).nucleus is None and Sampling(top_p=0.5).nucleus == 0.5
