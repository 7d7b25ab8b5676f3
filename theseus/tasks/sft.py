"""The ``sft`` task: supervised fine-tuning on conversations, the loss on the assistant's tokens.

Chat rows ``{"messages": [{"role", "content"}, ...]}`` (``data.chat_field``) are rendered by
the tokenizer's chat template (``theseus.data.chat``) and packed into windows
(``theseus.data.conversations``). An example is ``int32 [3, seq + 1]``: tokens, loss mask,
segment ids. The loss is the mean cross-entropy of the targets whose position is in the mask,
the model attending within each packed conversation only: transformers' loss with labels -100
outside ``assistant_masks`` (``data.train_on=all``: every token from position 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.config import ConfigError
from theseus.data.chat import ChatTemplate
from theseus.data.config import DataConfig
from theseus.data.conversations import ROWS, Conversations
from theseus.data.docstring_chats import stdlib_chats
from theseus.data.records import iter_records
from theseus.data.tokenizer import NAMES, ByteTokenizer, HFTokenizer, Tokenizer
from theseus.model.module import AUXILIARY, auxiliary
from theseus.tasks.lm import cross_entropy
from theseus.tasks.task import LossTask

CHAT_SOURCES = ("stdlib", "jsonl", "parquet", "arrow")


@dataclasses.dataclass(frozen=True)
class SupervisedFineTuning(LossTask):
    """Next-token loss on the masked tokens of rendered conversations, packed or padded; its
    settings are ``data.chat_field``, ``data.train_on``, ``data.packing``, ``data.chat_template``."""

    def example(self, seq_len: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((ROWS, seq_len + 1), jnp.int32)

    def dataset(self, data: DataConfig) -> Conversations:
        """The conversations of ``data`` (its source, path, tokenizer, split and seed), encoded."""
        if data.mixture:
            raise ConfigError("task=sft reads one source of conversations: drop data.mixture, set data.source and data.path")
        tokenizer = chat_tokenizer(data.tokenizer)
        template = ChatTemplate.find(data.tokenizer, data.chat_template)
        where = "the standard library" if data.source == "stdlib" else f"data.path={data.path}"
        return Conversations.encode(chat_rows(data), template, tokenizer, chat_field=data.chat_field,
                                    train_on=data.train_on, val_fraction=data.val_fraction, seed=data.seed,
                                    packing=data.packing, where=where)

    def tokenizer(self, data: DataConfig) -> Tokenizer:
        return chat_tokenizer(data.tokenizer)  # without encoding the corpus

    def check_data(self, dataset: Conversations, seq_len: int) -> None:
        """ConfigError unless some conversation of each split fits a window (the others are
        dropped, and counted on the console)."""
        for split in ("train", "val"):
            dataset.windows(split, seq_len, batch_size=1, seed=0)

    def loss(self, model: nn.Module, params: Any, batch: jax.Array, rng: jax.Array | None) -> jax.Array:
        """``batch: int32 [batch, 3, seq + 1]`` -> the mean loss over the masked targets."""
        return self._losses(model, params, batch, rng)[0]

    def loss_and_metrics(self, model: nn.Module, params: Any, batch: jax.Array,
                         rng: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The masked loss plus the penalty the model's layers sow (``auxiliary``: a mixture of
        experts' routers) and their metrics, with ``lm_loss``, the masked cross-entropy alone (as
        ``lm``'s); a model whose layers sow nothing gives the loss and no metrics."""
        lm_loss, penalty, metrics = self._losses(model, params, batch, rng)
        return lm_loss + penalty, {"lm_loss": lm_loss, **metrics} if metrics else {}

    def _losses(self, model: nn.Module, params: Any, batch: jax.Array,
                rng: jax.Array | None) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(masked cross-entropy, the sown penalty, its metrics)`` of ``batch``."""
        tokens, mask, segments = batch[:, 0], batch[:, 1], batch[:, 2]
        logits, sown = model.apply({"params": params}, tokens[:, :-1], deterministic=rng is None,
                                   segments=segments[:, :-1],
                                   rngs=None if rng is None else {"dropout": rng}, mutable=[AUXILIARY])
        lm_loss = cross_entropy(logits, jnp.where(mask[:, 1:] > 0, tokens[:, 1:], -1))
        return (lm_loss, *auxiliary(sown))


def chat_tokenizer(name: str) -> Tokenizer:
    """``data.tokenizer`` for conversations: byte, or a tokenizer.json (char and bpe are fitted
    to a text corpus, which a chat corpus is not)."""
    if name not in NAMES:
        return HFTokenizer.from_file(name)
    if name != "byte":
        raise ConfigError(f"task=sft takes data.tokenizer=byte or the path of a tokenizer.json, not {name} "
                          "(fitted to a text corpus): a trainer.init_from folder brings its own")
    return ByteTokenizer()


def chat_rows(data: DataConfig) -> Iterator[dict]:
    """The rows of ``data``'s source: the standard library's docstring chats, or the records of
    its jsonl, parquet or arrow files."""
    if data.source == "stdlib":
        return stdlib_chats(data.max_files)
    if data.source not in CHAT_SOURCES:
        raise ConfigError(f"task=sft reads conversations, not data.source={data.source}: use data.source=jsonl, "
                          "parquet or arrow (rows with a list of messages), or stdlib (docstring questions)")
    if data.path is None:
        raise ConfigError(f"data.source={data.source} needs data.path: a file, folder or glob of chat rows")
    return iter_records([Path(data.path)], data.source, data.split)
