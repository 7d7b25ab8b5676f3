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

import jax
import jax.numpy as jnp

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
    policy's, no gradient: the first of ``grpo.num_iterations`` passes); ``ref_per_token_logps``:
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
