"""The ``dpo`` task: direct preference optimisation (Rafailov et al., 2023) and the variants TRL
1.x names, with TRL's numbers.

A pair's log-ratios are ``d_c = logp(chosen) - ref_logp(chosen)`` and ``d_r`` for the rejected
completion (a completion's log-prob: the sum of its tokens' log-probs under the model, float32),
``d = d_c - d_r``, and ``n_c``, ``n_r`` the completions' token counts. Per pair, with ``beta``
(``dpo.beta``) and ``e`` (``dpo.label_smoothing``):

    sigmoid       -log sigmoid(beta d)                                       (DPO; ignores e)
    hinge         relu(1 - beta d)                                           (SLiC)
    ipo           (d_c / n_c - d_r / n_r - 1 / (2 beta))^2                  (IPO, per-token log-ratios)
    robust        (-(1 - e) log sigmoid(beta d) + e log sigmoid(-beta d)) / (1 - 2e)   (rDPO)
    sigmoid_norm  -log sigmoid(beta (d_c / n_c - d_r / n_r))
    exo_pair      q log(q / (1 - e)) + (1 - q) log((1 - q) / e),  q = sigmoid(beta d)   (EXO; e > 0)

The loss is their mean over the pairs. Logged beside it, as TRL names them: ``rewards/chosen``
and ``rewards/rejected`` (``beta d_c``, ``beta d_r``), ``rewards/margins`` (their difference),
``rewards/accuracies`` (the share of pairs whose chosen reward is strictly the greater: 0 when
the policy is the reference), ``logps/chosen`` and ``logps/rejected`` (the policy's), each a
mean over the pairs.

An example is a pair (``theseus.data.preferences``): its chosen and rejected sequences, their
completion masks and the reference's log-probs of both completions, computed once before
training (``reference_outputs``, under ``dpo.reference``'s weights) and kept with the data. Both
sequences of every pair go through the policy in one forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.config import ConfigError, Range, field
from theseus.data.config import DataConfig
from theseus.data.preferences import Preferences, pairs_tokenizer, prepare_pairs
from theseus.data.tokenizer import Tokenizer
from theseus.sources.model_source import ModelSource
from theseus.sources.parse import parse_source
from theseus.tasks.task import START, LossTask, OptionalChatTemplate
from theseus.tasks.token_logps import token_logps

NONE = "none"  # dpo.reference: reference-free, its log-probs 0


def sigmoid(d, d_norm, beta, e):
    """DPO's: ``-log sigmoid(beta d)``."""
    return -jax.nn.log_sigmoid(beta * d)


def hinge(d, d_norm, beta, e):
    """SLiC's: ``relu(1 - beta d)``."""
    return jax.nn.relu(1 - beta * d)


def ipo(d, d_norm, beta, e):
    """IPO's, on per-token log-ratios: ``(d_c / n_c - d_r / n_r - 1 / (2 beta))^2``."""
    return (d_norm - 1 / (2 * beta)) ** 2


def robust(d, d_norm, beta, e):
    """rDPO's, unbiased under preferences flipped with probability ``e``."""
    return (-(1 - e) * jax.nn.log_sigmoid(beta * d) + e * jax.nn.log_sigmoid(-beta * d)) / (1 - 2 * e)


def sigmoid_norm(d, d_norm, beta, e):
    """DPO's on per-token log-ratios: ``-log sigmoid(beta (d_c / n_c - d_r / n_r))``."""
    return -jax.nn.log_sigmoid(beta * d_norm)


def exo_pair(d, d_norm, beta, e):
    """EXO's: KL(softmax(beta [d_c, d_r]) || [1 - e, e])."""
    return (jax.nn.sigmoid(beta * d) * (jax.nn.log_sigmoid(beta * d) - jnp.log1p(-e))
            + jax.nn.sigmoid(-beta * d) * (jax.nn.log_sigmoid(-beta * d) - jnp.log(e)))


LOSSES: dict[str, Callable] = {f.__name__: f for f in (sigmoid, ipo, hinge, robust, sigmoid_norm, exo_pair)}


def dpo_loss(chosen_logps: jax.Array, rejected_logps: jax.Array, ref_chosen_logps: jax.Array,
             ref_rejected_logps: jax.Array, chosen_tokens: jax.Array, rejected_tokens: jax.Array, *, beta: float,
             loss_type: str, label_smoothing: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Each pair's loss (``LOSSES[loss_type]``) and the metrics TRL logs, per pair: every argument
    and result ``float32 [pairs]`` (``*_tokens``: the completions' token counts)."""
    chosen_ratio, rejected_ratio = chosen_logps - ref_chosen_logps, rejected_logps - ref_rejected_logps
    per_token = (chosen_ratio / jnp.maximum(chosen_tokens, 1) - rejected_ratio / jnp.maximum(rejected_tokens, 1))
    losses = LOSSES[loss_type](chosen_ratio - rejected_ratio, per_token, beta, label_smoothing)
    chosen_reward, rejected_reward = beta * chosen_ratio, beta * rejected_ratio
    return losses, {"rewards/chosen": chosen_reward, "rewards/rejected": rejected_reward,
                    "rewards/margins": chosen_reward - rejected_reward,
                    "rewards/accuracies": (chosen_reward > rejected_reward).astype(jnp.float32),
                    "logps/chosen": chosen_logps, "logps/rejected": rejected_logps}


def sequence_logps(logits: jax.Array, tokens: jax.Array, completion: jax.Array) -> jax.Array:
    """Each sequence's log-prob of its completion, float32 ``[n]``: the sum over the positions
    ``t >= 1`` with ``completion[t]`` of ``log p(tokens[t] | tokens[:t])``.

    ``logits: [n, seq, vocab]`` (of ``tokens[:, :-1]``), ``tokens``, ``completion: int [n, seq + 1]``.
    ``token_logps``: no log-softmax, nor float32 copy, of ``[n, seq, vocab]`` is kept.
    """
    return jnp.sum(jnp.where(completion[:, 1:] > 0, token_logps(logits, tokens[:, 1:]), 0.0), axis=-1)


@dataclasses.dataclass(frozen=True)
class DirectPreference(OptionalChatTemplate, LossTask):
    """Preference optimisation on pairs of completions, against a frozen reference model."""

    EVALUATE_SPLIT: ClassVar[str] = "all"  # theseus.evaluate scores every pair of a file it is given
    SEQUENCES: ClassVar[int] = 2  # a pair: its chosen and its rejected sequence
    CHAT: ClassVar[bool] = True

    beta: float = field("dpo.beta", default=0.1, check=Range(gt=0),
                        help="the strength of the reference: rewards are beta x the log-ratios to it "
                             "(ipo: the regularisation, its target margin 1 / (2 beta))")
    loss_type: str = field("dpo.loss_type", default="sigmoid", choices=tuple(LOSSES),
                           help="the loss of a pair's log-ratios, as TRL 1.x computes it: sigmoid (DPO), ipo, hinge, "
                                "robust, sigmoid_norm, exo_pair")
    label_smoothing: float = field("dpo.label_smoothing", default=0.0, check=Range(ge=0, lt=0.5),
                                   help="the probability that a preference is flipped (robust, exo_pair); the "
                                        "other losses ignore it")
    reference_given: str | None = field("dpo.reference", default=None,
                                        help="the frozen reference: None, the run's starting weights "
                                             "(trainer.init_from's; LoRA: the base, adapters off); a model source (a "
                                             "Hugging Face folder, a theseus run or checkpoint, a GGUF file, a model "
                                             "id in the local Hugging Face cache) of the policy's architecture; none: "
                                             "reference-free")

    def __post_init__(self):
        super().__post_init__()
        self.reference()  # a source that names no model: one line, before any work
        if self.loss_type == "exo_pair" and self.label_smoothing == 0:
            raise ConfigError("dpo.loss_type=exo_pair needs dpo.label_smoothing > 0 (the preferences' flip "
                              "probability; the EXO paper uses 1e-3): e.g. dpo.label_smoothing=0.001")

    def example(self, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
        pair = jax.ShapeDtypeStruct((2, seq_len + 1), jnp.int32)
        return {"tokens": pair, "completion": pair, "reference": jax.ShapeDtypeStruct((2,), jnp.float32)}

    def dataset(self, data: DataConfig) -> Preferences:
        """The pairs of ``data`` (its source, path, tokenizer, template, split and seed), tokenized:
        read from the cache after the first start (``theseus.data.preferences``)."""
        return prepare_pairs(data, reference_free=self.reference_given == NONE)

    def tokenizer(self, data: DataConfig) -> Tokenizer:
        return pairs_tokenizer(data)

    def longest_window(self, dataset: Preferences) -> int:
        """What the longest pair fills (its longer sequence: ``seq_len + 1`` tokens): a longer
        window holds no more pairs."""
        return dataset.longest() - 1

    def check_data(self, dataset: Preferences, seq_len: int) -> None:
        """ConfigError unless some pair of each split fits a window (the others are dropped, and
        counted on the console where a split's pairs are read)."""
        for split in ("train", "val"):
            dataset.fitting(split, seq_len)

    def reference(self) -> ModelSource | str | None:
        """``dpo.reference``'s model (``START``: unset, the run's own start; None: ``none``)."""
        if self.reference_given == NONE:
            return None
        return START if self.reference_given is None else parse_source(self.reference_given, "dpo.reference")

    def reference_outputs(self, model: nn.Module, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        """The log-probs of each pair's completions under ``params``, float32 ``[batch, 2]`` (chosen, rejected)."""
        return self._logps(model, params, batch, None)[0]

    def loss(self, model: nn.Module, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None) -> jax.Array:
        return self.loss_and_metrics(model, params, batch, rng)[0]

    def loss_and_metrics(self, model: nn.Module, params: Any, batch: dict[str, jax.Array],
                         rng: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The mean loss over the batch's pairs plus the penalty the model's layers sow (a mixture
        of experts' routers), with TRL's metrics, and the sown ones."""
        logps, penalty, sown = self._logps(model, params, batch, rng)
        loss, metrics = self._scores(logps, batch)
        return loss + penalty, {**metrics, **sown}

    def eval_loss_and_metrics(self, model: nn.Module, params: Any,
                              batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The mean loss over the batch's pairs and TRL's metrics (``val_loss``, ``val_rewards/...``):
        an all-zero pair (the padding of an evaluation's last batch) counts in neither."""
        return self._scores(self._logps(model, params, batch, None)[0], batch)

    def _scores(self, logps: jax.Array, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``(loss, metrics)``: ``dpo_loss`` of the policy's ``logps: [batch, 2]``, meaned over the real pairs."""
        counts = batch["completion"].sum(axis=-1).astype(jnp.float32)  # [batch, 2]: the completions' tokens
        reference = batch["reference"]
        losses, metrics = dpo_loss(logps[:, 0], logps[:, 1], reference[:, 0], reference[:, 1], counts[:, 0],
                                   counts[:, 1], beta=self.beta, loss_type=self.loss_type,
                                   label_smoothing=self.label_smoothing)
        real = (counts[:, 0] > 0).astype(jnp.float32)

        def mean(values: jax.Array) -> jax.Array:
            return jnp.sum(values * real) / jnp.maximum(jnp.sum(real), 1.0)

        return mean(losses), {name: mean(values) for name, values in metrics.items()}

    def _logps(self, model: nn.Module, params: Any, batch: dict[str, jax.Array],
               rng: jax.Array | None) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(logps [batch, 2], the sown penalty, its metrics)``: both sequences of every pair in one
        forward, ``[batch, 2, seq + 1]`` read as ``[2 batch, seq + 1]`` (each device keeps its pairs)."""
        tokens, completion = (batch[key].reshape(-1, batch[key].shape[-1]) for key in ("tokens", "completion"))
        logits, penalty, metrics = self.forward(model, params, tokens[:, :-1], rng)
        return sequence_logps(logits, tokens, completion).reshape(-1, 2), penalty, metrics
