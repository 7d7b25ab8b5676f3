"""The ``grpo`` task's mathematics: group-relative advantages and the clipped policy loss, as
pure functions over arrays (GRPO: Shao et al., 2024; DAPO: Yu et al., 2025; Dr. GRPO: Liu et
al., 2025), with TRL 1.x's numbers and names.

Advantages. The completions of a step come in groups of ``G`` (``grpo.num_generations``), one
group per prompt; a completion's advantage is its reward against its group's:

    A = (r - mean_group(r)) / (std + eps)        std: the group's (``scale_rewards=group``), the
                                                 step's (``batch``), or none (``none``: A = r - mean)

``std`` is the sample standard deviation (Bessel's correction) and ``eps`` 1e-4: TRL's
convention. Others differ, and the difference is a scale on the advantages: Tunix uses the
sample std + 1e-6, MaxText's native GRPO the population std (no correction) + 1e-8, DeepSeek's
paper the population std; Dr. GRPO drops the division altogether (``none``). An unscorable
completion (a NaN reward: every reward function returned None) counts in no statistic and gets
advantage 0, and so does every completion of a group with fewer than two scorable rewards.

The policy loss, per completion token t of completion i (``ratio = exp(logp - old_logp)``,
``clamp`` with ``epsilon`` below and ``epsilon_high`` above 1):

    loss_it = -min(ratio A_i, clamp(ratio) A_i) + beta KL_it
    KL_it   = ratio (exp(ref - logp) - (ref - logp) - 1)          (k3, with TRL's ratio correction)

aggregated by ``loss_type`` over the completion mask (``T``: ``max_completion_length``):

    dapo     sum over every token / the tokens of the step (``num_items``)   (TRL's default)
    grpo     each completion's token mean, meaned over completions           (the paper's)
    bnpo     sum over the batch's tokens / the batch's tokens
    dr_grpo  sum over the batch's tokens / (completions x T)

``clamp`` passes the gradient on its boundary, as ``torch.clamp`` does (``jnp.clip`` halves it
there); ``min`` splits it at a tie, as ``torch.minimum`` does.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from theseus.config import NON_NEGATIVE, POSITIVE, ConfigError, Range, field
from theseus.data.config import DataConfig
from theseus.data.prompts import Prompts, prompt_tokenizer
from theseus.data.tokenizer import Tokenizer
from theseus.tasks.grpo_rollout import GRPORollout
from theseus.tasks.rewards import Rewards
from theseus.tasks.task import LossTask, OptionalChatTemplate, Rollout, StepLayout
from theseus.tasks.token_logps import token_logps

SCALE_REWARDS = ("group", "batch", "none")
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")


def group_statistics(rewards: jax.Array, num_generations: int) -> tuple[jax.Array, jax.Array]:
    """``(mean, std)`` of each completion's group, float32 ``[completions]`` each: NaN rewards left
    out; ``std`` with Bessel's correction, NaN for a group of fewer than two scorable rewards.
    ``rewards: [completions]`` in consecutive groups of ``num_generations``."""
    grouped = jnp.asarray(rewards, jnp.float32).reshape(-1, num_generations)
    mean, std = _nan_mean_std(grouped, axis=1)
    return jnp.repeat(mean, num_generations), jnp.repeat(std, num_generations)


def group_advantages(rewards: jax.Array, num_generations: int, scale_rewards: str = "group",
                     eps: float = 1e-4) -> jax.Array:
    """Each completion's advantage, float32 ``[completions]``: its reward less its group's mean,
    over the group's (``group``) or the whole batch's (``batch``) sample std + ``eps``, or not
    scaled (``none``). ``rewards: [completions]`` in consecutive groups of ``num_generations``
    (TRL's layout); NaN (unscorable) gives 0, and so does a group with a single scorable reward."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALE_REWARDS)}, got {scale_rewards!r}")
    rewards = jnp.asarray(rewards, jnp.float32)
    mean, std = group_statistics(rewards, num_generations)
    if scale_rewards == "batch":
        std = _nan_mean_std(rewards, axis=0)[1]
    advantages = rewards - mean  # 0 for a lone scorable reward, NaN for an unscorable one
    if scale_rewards != "none":
        advantages = advantages / (std + eps)  # NaN where a group's std is undefined
    return jnp.nan_to_num(advantages, nan=0.0)


def advantages_by_prompt(rewards: np.ndarray, prompt_ids: np.ndarray, num_generations: int, scale_rewards: str,
                         eps: float = 1e-4) -> np.ndarray:
    """``group_advantages`` of completions in any order: each completion's group is the completions
    of the same ``prompt_ids`` (each id ``num_generations`` times), wherever they lie."""
    order = np.argsort(prompt_ids, kind="stable")
    advantages = np.empty(len(rewards), np.float32)
    advantages[order] = np.asarray(group_advantages(np.asarray(rewards)[order], num_generations, scale_rewards, eps))
    return advantages


def _nan_mean_std(x: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """The mean and the sample std (Bessel's) of ``x`` over ``axis``, NaNs left out; the std is
    NaN where fewer than two values count (TRL's ``nanstd``)."""
    count = jnp.sum(~jnp.isnan(x), axis=axis)
    mean = jnp.nansum(x, axis=axis) / count
    squares = jnp.nansum((x - jnp.expand_dims(mean, axis)) ** 2, axis=axis)
    return mean, jnp.where(count > 1, jnp.sqrt(squares / jnp.maximum(count - 1, 1)), jnp.nan)


def clamp(x: jax.Array, low: float, high: float) -> jax.Array:
    """``x`` limited to ``[low, high]``, its gradient passed where ``low <= x <= high`` (the
    boundary included, as ``torch.clamp``'s; ``jnp.clip`` gives half there)."""
    return jnp.where(x < low, low, jnp.where(x > high, high, x))


def policy_loss(per_token_logps: jax.Array, old_per_token_logps: jax.Array | None,
                ref_per_token_logps: jax.Array | None, advantages: jax.Array, completion_mask: jax.Array, *,
                loss_type: str = "dapo", epsilon: float = 0.2, epsilon_high: float | None = None,
                beta: float = 0.0, max_completion_length: int | None = None,
                num_items: jax.Array | float | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The clipped surrogate loss of a batch of completions and its metrics: ``(loss, {"clip_ratio",
    "kl"})``, float32 scalars (``kl`` only when ``beta`` is not 0).

    ``per_token_logps``: ``[completions, completion tokens]``, the policy's log-probs of the
    completions' tokens (differentiated); ``old_per_token_logps``: theirs when sampled (None: the
    policy's own, detached: ``grpo.num_iterations=1``, the ratio 1); ``ref_per_token_logps``:
    the reference's (None when ``beta`` is 0); ``advantages: [completions]``; ``completion_mask``:
    the completions' real tokens (1) and padding (0). ``epsilon_high`` defaults to ``epsilon``;
    ``max_completion_length`` (``dr_grpo``'s constant) to the arrays' width. ``num_items``: the
    token count ``dapo`` divides by (default: this batch's; a micro-batch of an accumulated step
    gives the step's tokens / ``grad_accum``, TRL's ``num_items_in_batch``, so that the step's
    sum of micro-batch losses / ``grad_accum`` is the step's token mean). ``clip_ratio`` is TRL's
    ``clip_ratio/region_mean``: the share of tokens whose ratio the clip holds (below 1 - epsilon
    with A < 0, above 1 + epsilon_high with A > 0).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")
    if beta and ref_per_token_logps is None:
        raise ValueError(f"beta={beta} needs the reference's log-probs (ref_per_token_logps)")
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    logps = per_token_logps.astype(jnp.float32)
    old = jax.lax.stop_gradient(logps) if old_per_token_logps is None else old_per_token_logps.astype(jnp.float32)
    mask = completion_mask.astype(jnp.float32)
    advantage = advantages.astype(jnp.float32)[:, None]

    ratio = jnp.exp(logps - old)
    per_token = -jnp.minimum(ratio * advantage, clamp(ratio, 1 - epsilon, 1 + epsilon_high) * advantage)
    metrics = {}
    if beta:
        delta = ref_per_token_logps.astype(jnp.float32) - logps
        kl = (jnp.exp(delta) - delta - 1) * ratio
        per_token = per_token + beta * kl
        metrics["kl"] = masked_mean(kl, mask)
    clipped = ((ratio < 1 - epsilon) & (advantage < 0)) | ((ratio > 1 + epsilon_high) & (advantage > 0))
    metrics["clip_ratio"] = masked_mean(clipped.astype(jnp.float32), mask)

    total = jnp.sum(per_token * mask)
    if loss_type == "grpo":
        loss = jnp.mean(jnp.sum(per_token * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0))
    elif loss_type == "bnpo":
        loss = total / jnp.maximum(jnp.sum(mask), 1.0)
    elif loss_type == "dr_grpo":
        loss = total / (mask.shape[0] * (max_completion_length or mask.shape[1]))
    else:  # dapo
        loss = total / jnp.maximum(jnp.sum(mask) if num_items is None else num_items, 1.0)
    return loss, metrics


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean of ``x`` over the positions where ``mask`` is 1 (0 when there is none)."""
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def completion_logps(logits: jax.Array, tokens: jax.Array, prompt_lengths: jax.Array, width: int,
                     temperature: float) -> jax.Array:
    """float32 ``[batch, width]``: the log-prob of each completion token under ``softmax(logits /
    temperature)`` (TRL's, the sampling distribution), token t of row i being
    ``tokens[i, prompt_lengths[i] + t]``, predicted at position ``prompt_lengths[i] + t - 1``.

    ``logits: [batch, seq, vocab]`` of ``tokens[:, :-1]`` (``tokens: int [batch, seq + 1]``); the
    completions fit the window (``prompt_lengths + width <= seq + 1``). Only ``width`` positions
    a row are gathered before the logsumexp: no log-softmax over the window is kept.
    """
    at = prompt_lengths[:, None] + jnp.arange(width)  # [batch, width]: where each completion token is
    picked = jnp.take_along_axis(logits, (at - 1)[..., None], axis=1).astype(jnp.float32) / temperature
    return token_logps(picked, jnp.take_along_axis(tokens, at, axis=1))


@dataclasses.dataclass(frozen=True)
class GroupRelativePolicyOptimization(OptionalChatTemplate, LossTask):
    """GRPO on prompt rows scored by reward functions: each step samples ``grpo.num_generations``
    completions of ``trainer.batch_size / grpo.num_generations`` prompts with the current params
    (``rollout``), scores them, and descends ``policy_loss`` on their group-relative advantages."""

    reward: str | list[str] | None = field(
        "grpo.reward", default=None,
        help="the reward function(s), module:function (rewards:correct: correct of rewards.py in the working "
             "directory or your project), called as TRL calls them: f(prompts, completions, completion_ids, "
             "**columns) -> list[float | None]")
    reward_weights: list[float] | None = field("grpo.reward_weights", default=None,
                                               help="one weight per reward function (None: 1 each)")
    num_generations: int = field("grpo.num_generations", default=8, check=Range(ge=2),
                                 help="completions sampled per prompt (a group); trainer.batch_size counts completions")
    max_completion_length: int = field("grpo.max_completion_length", default=512, check=POSITIVE,
                                       help="tokens a completion may take (prompt + completion fit "
                                            "architecture.seq_len + 1); dr_grpo's constant")
    temperature: float = field("grpo.temperature", default=1.0, check=POSITIVE,
                               help="sampling temperature; the log-probs are of logits / temperature, as sampled")
    top_p: float = field("grpo.top_p", default=1.0, check=Range(gt=0, le=1),
                         help="sampling: the smallest set of tokens whose probability exceeds top_p (1: all)")
    top_k: int = field("grpo.top_k", default=0, check=NON_NEGATIVE,
                       help="sampling: the top_k likeliest tokens (0: all)")
    beta: float = field("grpo.beta", default=0.0, check=NON_NEGATIVE,
                        help="weight of the k3 KL to the reference (the run's start: trainer.init_from's weights, "
                             "LoRA's base with the adapters off); 0: no reference")
    epsilon: float = field("grpo.epsilon", default=0.2, check=Range(gt=0, lt=1),
                           help="the ratio is clipped below at 1 - epsilon")
    epsilon_high: float | None = field("grpo.epsilon_high", default=None, check=POSITIVE,
                                       help="the ratio is clipped above at 1 + epsilon_high (None: epsilon; "
                                            "DAPO: 0.28)")
    num_iterations: int = field("grpo.num_iterations", default=1, check=Range(ge=1),
                                help="optimizer steps on each batch of completions (mu), against their old log-probs")
    loss_type: str = field("grpo.loss_type", default="dapo", choices=LOSS_TYPES,
                           help="how token losses are averaged: dapo (over the step's tokens), grpo (per completion, "
                                "then over completions), bnpo (over a micro-batch's tokens), dr_grpo (over "
                                "completions x max_completion_length)")
    scale_rewards: str = field("grpo.scale_rewards", default="group", choices=SCALE_REWARDS,
                               help="advantages divided by the group's std (group), the batch's (batch), or not (none)")

    def __post_init__(self):
        super().__post_init__()
        if self.reward is None:
            raise ConfigError("task=grpo needs grpo.reward: a reward function, e.g. grpo.reward=rewards:correct "
                              "(correct of rewards.py beside the command)")
        Rewards.check(self.reward, self.reward_weights)  # their form; imported before the run compiles

    @cached_property
    def rewards(self) -> Rewards:
        """The reward functions, imported on first use (ConfigError in one line)."""
        return Rewards.load(self.reward, self.reward_weights)

    def dataset(self, data: DataConfig) -> Prompts:
        return Prompts.read(data, self.num_generations, self.max_completion_length)

    def tokenizer(self, data: DataConfig) -> Tokenizer:
        return prompt_tokenizer(data)

    def chats(self, dataset: Prompts) -> bool:
        """Whether the prompts are conversations (messages, rendered by the chat template), not strings."""
        return dataset.conversational

    def check_data(self, dataset: Prompts, seq_len: int) -> None:
        """ConfigError unless some prompt of each split leaves room for a completion, the reward
        functions import and take the arguments they are given, and ``grpo.top_k`` is within the
        vocabulary."""
        for split in ("train", "val"):
            dataset.fitting(split, seq_len)
        self.rewards.check_arguments(dataset.column_names)  # imported here, before anything compiles
        if self.top_k > dataset.vocab_size:
            raise ConfigError(f"grpo.top_k={self.top_k} is more than the {dataset.vocab_size} tokens of the "
                              f"vocabulary: give at most {dataset.vocab_size}, or 0 (every token)")

    def check_batch(self, batch_size: int, grad_accum: int, processes: int) -> None:
        """Each process samples whole groups: ``trainer.batch_size / processes`` completions divide
        by ``grpo.num_generations``."""
        if batch_size % (self.num_generations * processes):
            raise ConfigError(f"trainer.batch_size={batch_size} counts completions: it must divide by "
                              f"grpo.num_generations={self.num_generations}"
                              + (f" x the {processes} processes" if processes > 1 else "")
                              + f", e.g. trainer.batch_size={self.num_generations * processes * max(1, batch_size // (self.num_generations * processes))}")

    def example(self, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
        """A completion: ``tokens`` (its prompt then itself, 0 after), ``prompt`` and ``completion``
        (their lengths), its ``advantage``, ``items`` (the step's completion tokens / grad_accum,
        dapo's normaliser), and, where they are needed, the log-probs of its tokens when sampled
        (``old``: ``num_iterations > 1``) and under the reference (``reference``: ``beta > 0``)."""
        width = self.max_completion_length
        scalar_i, scalar_f = jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((), jnp.float32)
        out = {"tokens": jax.ShapeDtypeStruct((seq_len + 1,), jnp.int32), "prompt": scalar_i,
               "completion": scalar_i, "advantage": scalar_f, "items": scalar_f}
        if self.num_iterations > 1:
            out["old"] = jax.ShapeDtypeStruct((width,), jnp.float32)
        if self.beta:
            out["reference"] = jax.ShapeDtypeStruct((width,), jnp.float32)
        return out

    def logps(self, model: nn.Module, params: Any, batch: dict[str, jax.Array],
              rng: jax.Array | None = None) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(per-token log-probs [batch, max_completion_length], the sown penalty, its metrics)``
        of the completions of ``batch`` under ``params`` (logits / temperature)."""
        logits, penalty, metrics = self.forward(model, params, batch["tokens"][:, :-1], rng)
        logps = completion_logps(logits, batch["tokens"], batch["prompt"], self.max_completion_length,
                                 self.temperature)
        return logps, penalty, metrics

    def loss_and_metrics(self, model: nn.Module, params: Any, batch: dict[str, jax.Array],
                         rng: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``policy_loss`` of the micro-batch's completions plus the penalty the model's layers sow,
        with ``clip_ratio`` (and ``kl``), and the sown metrics."""
        logps, penalty, sown = self.logps(model, params, batch, rng)
        mask = jnp.arange(self.max_completion_length) < batch["completion"][:, None]
        loss, metrics = policy_loss(logps, batch.get("old"), batch.get("reference"), batch["advantage"], mask,
                                    loss_type=self.loss_type, epsilon=self.epsilon, epsilon_high=self.epsilon_high,
                                    beta=self.beta, max_completion_length=self.max_completion_length,
                                    num_items=batch["items"][0])
        return loss + penalty, {**metrics, **sown}

    def loss(self, model: nn.Module, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None) -> jax.Array:
        return self.loss_and_metrics(model, params, batch, rng)[0]

    def advantages(self, rewards: np.ndarray, prompt_ids: np.ndarray) -> tuple[np.ndarray, float]:
        """Each completion's advantage (``advantages_by_prompt`` at ``grpo.scale_rewards``) and
        TRL's ``frac_reward_zero_std``: the share of completions whose group's rewards (the
        step's, with ``scale_rewards=batch``) agree to 1e-8, NaN rewards left out."""
        if self.scale_rewards == "batch":
            std = np.repeat(np.asarray(_nan_mean_std(jnp.asarray(rewards, jnp.float32), axis=0)[1]), len(rewards))
        else:
            order = np.argsort(prompt_ids, kind="stable")
            std = np.asarray(group_statistics(np.asarray(rewards)[order], self.num_generations)[1])
        zero = float(np.mean(np.isclose(std, 0.0)))  # torch.isclose's tolerances, as TRL's; NaN never close
        return advantages_by_prompt(rewards, prompt_ids, self.num_generations, self.scale_rewards), zero

    def rollout(self, layout: StepLayout, dataset: Prompts) -> Rollout:
        """Completions of the loader's prompts, sampled with the current params and scored."""
        return GRPORollout(self, layout, dataset)
