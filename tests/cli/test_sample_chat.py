"""``theseus.sample --chat``: the reply to a message rendered by the chat template, up to the
template's end-of-turn token, with theseus's byte tokenizer and the char and bpe ones fitted to
a chat corpus (theseus's default template: <|endoftext|> ends each turn)."""

from __future__ import annotations

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.cli.conversation import Conversation
from theseus.config import configuration, configure, registry
from theseus.data.chat import ChatTemplate
from theseus.data.chat_corpus import chat_tokenizer
from theseus.data.config import DataConfig
from theseus.model.models.gpt import GPT
from theseus.model.sampling import Sampling

CORPUS = [[{"role": "user", "content": "Say ok."}, {"role": "assistant", "content": "ok"}],
          [{"role": "user", "content": "Say no."}, {"role": "assistant", "content": "no, not ok"}]]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte", "char", "bpe"])
def test_chat_reply_stops_at_the_end_of_turn_token(kind):
    """A model rigged to map each token to a next one (blocks zeroed, the head a lookup): after the
    generation prompt's newline it says ``o``, ``k``, then <|endoftext|>, then <|endoftext|> for ever."""
    template = ChatTemplate.find(kind)
    tokenizer = chat_tokenizer(DataConfig(tokenizer=kind, bpe_vocab_size=300),
                               [template.render(messages)[0] for messages in CORPUS], template)
    vocab = tokenizer.vocab_size
    with configuration({"architecture.n_layers": 1, "architecture.d_model": 64, "architecture.n_heads": 4,
                        "architecture.seq_len": 128, "architecture.positions": "rope",
                        "architecture.tie_embeddings": False, "architecture.dtype.activation": "float32"}):
        model = configure(GPT, vocab_size=vocab)
    params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))["params"]
    params = jax.tree.map(jnp.zeros_like, params)
    params["ln_f"] = jax.tree.map(jnp.ones_like, params["ln_f"])  # scale 1 (the bias is zeroed too, if any)
    if "bias" in params["ln_f"]:
        params["ln_f"]["bias"] = jnp.zeros_like(params["ln_f"]["bias"])
    wte = np.random.default_rng(0).normal(size=(vocab, 64)).astype(np.float32)
    newline, o, k = (tokenizer.encode(c)[0] for c in "\nok")
    following = {newline: o, o: k, k: tokenizer.eot}
    head = np.zeros((64, vocab), np.float32)
    for token in range(vocab):
        head[:, following.get(token, token)] += wte[token]
    params["wte"]["embedding"] = jnp.asarray(wte)
    params["lm_head"] = jnp.asarray(head)
    registry.load()  # task=sft: the template it renders with
    trained = types.SimpleNamespace(cfg={"data.tokenizer": kind, "choices": {"task": "sft"}}, tokenizer=tokenizer,
                                    model=model, params=params)
    chat = Conversation.of(trained, sampling=Sampling(0.0), max_new_tokens=8)

    prompt = chat.prompt("Say ok.")
    assert tokenizer.decode(prompt.tolist()) == "<|user|>\nSay ok.<|endoftext|>\n<|assistant|>\n"
    assert prompt[-1] == newline and template.end_of_turn(tokenizer) == tokenizer.eot
    assert chat.say("Say ok.") == ("ok", [o, k])
    if kind == "char":  # a character the corpus never had: refused, not dropped
        with pytest.raises(ValueError, match="character 'z' is not in the char vocabulary"):
            chat.say("Say z.")
