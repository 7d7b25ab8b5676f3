"""``theseus.sample --chat``: the reply to a message rendered by the chat template, up to the
template's end-of-turn token."""

from __future__ import annotations

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import configuration, configure
from theseus.data.chat import ChatTemplate, chat_prompt
from theseus.data.tokenizer import ByteTokenizer
from theseus.model.models.gpt import GPT
from theseus.sample import reply


@pytest.mark.slow
def test_chat_reply_stops_at_the_end_of_turn_token():
    """A model rigged to map each token to a next one (blocks zeroed, the head a lookup): after the
    generation prompt's newline it says ``o``, ``k``, then <|endoftext|>, then <|endoftext|> for ever."""
    tokenizer = ByteTokenizer()
    with configuration({"architecture.n_layers": 1, "architecture.d_model": 64, "architecture.n_heads": 4,
                        "architecture.seq_len": 128, "architecture.positions": "rope",
                        "architecture.tie_embeddings": False, "architecture.dtype.activation": "float32"}):
        model = configure(GPT, vocab_size=257)
    params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))["params"]
    params = jax.tree.map(jnp.zeros_like, params)
    params["ln_f"] = jax.tree.map(jnp.ones_like, params["ln_f"])  # scale 1 (the bias is zeroed too, if any)
    if "bias" in params["ln_f"]:
        params["ln_f"]["bias"] = jnp.zeros_like(params["ln_f"]["bias"])
    wte = np.random.default_rng(0).normal(size=(257, 64)).astype(np.float32)
    following = {ord("\n"): ord("o"), ord("o"): ord("k"), ord("k"): tokenizer.eot}
    head = np.zeros((64, 257), np.float32)
    for token in range(257):
        head[:, following.get(token, token)] += wte[token]
    params["wte"]["embedding"] = jnp.asarray(wte)
    params["lm_head"] = jnp.asarray(head)
    trained = types.SimpleNamespace(cfg={}, tokenizer=tokenizer, model=model, params=params)

    prompt = chat_prompt(ChatTemplate.find("byte"), tokenizer, "Say ok.")
    assert tokenizer.decode(prompt.tolist()) == "<|user|>\nSay ok.<|endoftext|>\n<|assistant|>\n"
    assert reply(trained, "Say ok.", 8, temperature=0.0) == "ok"
