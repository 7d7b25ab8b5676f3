"""The ``lm`` task (the default): next-token prediction.

An example is a window of ``seq + 1`` token ids, ``int32 [seq + 1]``: the model reads
``tokens[:, :-1]`` and is scored on predicting ``tokens[:, 1:]`` by ``cross_entropy``. Training
adds what the model's layers sow as auxiliary losses (``theseus.model.module.auxiliary``: a
mixture of experts' routers, say); evaluations score the cross-entropy alone.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.tasks.task import LossTask
from theseus.tasks.token_logps import CROSS_ENTROPY, token_logps


@dataclasses.dataclass(frozen=True)
class LanguageModeling(LossTask):
    """Next-token prediction: mean cross-entropy; evaluations also give bits per byte."""

    def example(self, seq_len: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((seq_len + 1,), jnp.int32)

    def loss(self, model: nn.Module, params: Any, batch: jax.Array, rng: jax.Array | None) -> jax.Array:
        """``batch: int32 [batch, seq + 1]`` -> the mean next-token loss of ``model``."""
        return cross_entropy(self.forward(model, params, batch[:, :-1], rng)[0], batch[:, 1:])

    def loss_and_metrics(self, model: nn.Module, params: Any, batch: jax.Array,
                         rng: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The next-token loss plus the penalty the model's layers sow (``auxiliary``: averaged
        over the layers that sow it), and their metrics with ``lm_loss``, the cross-entropy
        alone; a model whose layers sow nothing gives ``loss`` and no metrics. A subclass
        that overrides ``loss`` has its own objective: that, with no metrics."""
        if type(self).loss is not LanguageModeling.loss:
            return super().loss_and_metrics(model, params, batch, rng)
        logits, penalty, metrics = self.forward(model, params, batch[:, :-1], rng)
        lm_loss = cross_entropy(logits, batch[:, 1:])
        return lm_loss + penalty, {"lm_loss": lm_loss, **metrics} if metrics else {}

    def val_metrics(self, val_loss: float, bytes_per_token: float | None) -> dict[str, float]:
        """``val_loss`` (nats per token) and, for byte-sized text, ``val_bpb`` (bits per byte)."""
        metrics = {"val_loss": val_loss}
        if bytes_per_token:
            metrics["val_bpb"] = val_loss / (math.log(2) * bytes_per_token)
        return metrics


@jax.named_scope(CROSS_ENTROPY)
def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token loss, float32, over positions whose target is not -1.

    ``logits: [batch, seq, vocab]`` (any float dtype: no float32 copy of them is kept, see
    ``token_logps``), ``targets: int[batch, seq]``.
    """
    keep = targets != -1
    nll = -token_logps(logits, jnp.where(keep, targets, 0))
    return jnp.sum(jnp.where(keep, nll, 0.0)) / jnp.maximum(jnp.sum(keep), 1)
