"""The ``sft`` task: supervised fine-tuning on conversations, the loss on the assistant's tokens.

Chat rows ``{"messages": [{"role", "content"}, ...]}`` (``data.chat_field``) are rendered by
the tokenizer's chat template (``theseus.data.chat``), prepared once into the cache
(``theseus.data.chat_corpus``) and packed into windows (``theseus.data.conversations``). An
example is ``int32 [3, seq + 1]``: tokens, loss mask, segment ids. The loss is the mean cross-entropy of the targets whose position is in the mask,
the model attending within each packed conversation only: transformers' loss with labels -100
outside ``assistant_masks`` (``data.train_on=all``: every token from position 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.data.chat import ChatTemplate
from theseus.data.chat_corpus import prepare_chats
from theseus.data.config import DataConfig
from theseus.data.conversations import ROWS, Conversations
from theseus.data.tokenizer import NAMES, ByteTokenizer, HFTokenizer, Tokenizer
from theseus.tasks.lm import cross_entropy
from theseus.tasks.task import LossTask


@dataclasses.dataclass(frozen=True)
class SupervisedFineTuning(LossTask):
    """Next-token loss on the masked tokens of rendered conversations, packed or padded; its
    settings are ``data.chat_field``, ``data.train_on``, ``data.packing``, ``data.chat_template``."""

    CHAT: ClassVar[bool] = True

    def example(self, seq_len: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((ROWS, seq_len + 1), jnp.int32)

    def dataset(self, data: DataConfig) -> Conversations:
        """The conversations of ``data`` (its source, path, tokenizer, template, split and seed),
        encoded: read from the cache after the first start (``theseus.data.chat_corpus``)."""
        return prepare_chats(data)

    def tokenizer(self, data: DataConfig) -> Tokenizer:
        """byte's, or a tokenizer.json's, without reading the corpus; char and bpe are fitted to
        it (the cache keeps them)."""
        if data.tokenizer == "byte":
            return ByteTokenizer()
        if data.tokenizer not in NAMES:
            return HFTokenizer.from_file(data.tokenizer)
        return prepare_chats(data).tokenizer

    def check_model(self, model: nn.Module) -> None:
        """The model takes ``segments=`` as ``loss`` passes them: its call traced abstractly on a
        two-token window, so that a layer written without them (a user's attention) is refused
        in one line before the conversations are rendered."""
        tokens = jax.ShapeDtypeStruct((1, 2), jnp.int32)
        jax.eval_shape(lambda t: model.init(jax.random.key(0), t, segments=t), tokens)

    def check_data(self, dataset: Conversations, seq_len: int) -> None:
        """ConfigError unless some conversation of each split fits a window (the others are
        dropped, and counted on the console)."""
        for split in ("train", "val"):
            dataset.windows(split, seq_len, batch_size=1, seed=0)

    def longest_window(self, dataset: Conversations) -> int:
        """What the longest conversation fills (one of ``seq_len + 1`` tokens): a longer window
        holds no more of them whole."""
        return max(dataset.longest(split) for split in ("train", "val")) - 1

    def chat_template(self, data: DataConfig) -> ChatTemplate:
        """``data.chat_template``, the tokenizer's, or theseus's default (``ChatTemplate.find``)."""
        return ChatTemplate.find(data.tokenizer, data.chat_template)

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
        logits, penalty, metrics = self.forward(model, params, tokens[:, :-1], rng, segments=segments[:, :-1])
        return cross_entropy(logits, jnp.where(mask[:, 1:] > 0, tokens[:, 1:], -1)), penalty, metrics
