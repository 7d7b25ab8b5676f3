"""load_hf_gpt2: a randomly initialised Hugging Face GPT-2 gives the same logits here (nothing downloaded).

Test dependencies: torch (CPU) and transformers.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import configuration, configure
from theseus.interop.hf_weights import load_hf_gpt2
from theseus.model.models.gpt import GPT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def hf_gpt2(n_embd: int, n_head: int, tied: bool):
    """A small GPT2LMHeadModel with every weight random (biases and norm scales included)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=101, n_positions=24, n_embd=n_embd, n_layer=2, n_head=n_head,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=tied,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


@pytest.mark.parametrize(("n_embd", "n_head", "as_numpy", "tied", "scan"),
                         [(128, 2, False, True, False), (48, 4, True, False, False), (48, 4, False, True, True)])
def test_logits_equal_transformers(n_embd, n_head, as_numpy, tied, scan):
    hf = hf_gpt2(n_embd, n_head, tied)
    state = hf.state_dict()
    if as_numpy:
        state = {k: v.numpy() for k, v in state.items()}
    # heads: 128 / 64 = 2 follows GPT-2's head size of 64; 48 / 4 does not, so it is given
    overrides, params = load_hf_gpt2(state, n_heads=None if n_embd == 128 else n_head, scan_layers=scan)
    assert overrides["architecture.n_heads"] == n_head and overrides["architecture.tie_embeddings"] is tied
    assert overrides["architecture.scan_layers"] is scan and ("h" in params) is scan  # stacked: one "h"
    with configuration({**overrides, "architecture.dtype.activation": "float32"}):
        model = configure(GPT)

    expected = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"]
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(lambda s: s.shape, expected)

    tokens = np.random.default_rng(0).integers(0, 101, size=(3, 24))
    with torch.no_grad():
        reference = hf(torch.from_numpy(tokens)).logits.numpy()
    logits = jax.jit(model.apply)({"params": params}, jnp.asarray(tokens, jnp.int32))
    assert np.abs(reference).max() > 1.0  # the tolerance is small against the logits
    np.testing.assert_allclose(np.asarray(logits), reference, atol=1e-4, rtol=0)
