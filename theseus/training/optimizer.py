"""Optimizer settings (optax): AdamW with clipping and a learning-rate schedule."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from theseus.config import ConfigError, Configurable, field, register


@register("optimizer", "adamw")
@dataclasses.dataclass(frozen=True)
class OptimizerConfig(Configurable):
    name: str = field("optimizer/name", default="adamw", choices=("adamw",), help="the optax optimizer")
    lr: float = field("optimizer/lr", default=3e-4, help="peak learning rate")
    b1: float = field("optimizer/b1", default=0.9, help="Adam first-moment decay")
    b2: float = field("optimizer/b2", default=0.95, help="Adam second-moment decay")
    eps: float = field("optimizer/eps", default=1e-8, help="Adam epsilon")
    weight_decay: float = field("optimizer/weight_decay", default=0.1, help="decoupled weight decay (not on norms, biases, embeddings)")
    clip_norm: float | None = field("optimizer/clip_norm", default=1.0, help="global gradient-norm clip; null: off")
    schedule: str = field("optimizer/schedule", default="cosine", choices=("constant", "cosine", "wsd"), help="learning-rate schedule")
    warmup_steps: int = field("optimizer/warmup_steps", default=100, help="linear warmup steps")
    min_lr_ratio: float = field("optimizer/min_lr_ratio", default=0.1, help="final lr as a fraction of lr (cosine, wsd)")
    decay_fraction: float = field("optimizer/decay_fraction", default=0.2, help="wsd: fraction of steps spent decaying")

    def __post_init__(self):
        """Each setting within its range, so a bad value fails before a run starts."""
        if not self.lr > 0:
            raise ConfigError(f"optimizer.lr must be positive, got {self.lr}: give a peak rate such as optimizer.lr=3e-4")
        for key in ("b1", "b2"):
            if not 0 <= getattr(self, key) < 1:
                raise ConfigError(f"optimizer.{key} must be in [0, 1), got {getattr(self, key)}: "
                                  f"e.g. optimizer.{key}={OptimizerConfig.__dataclass_fields__[key].default}")
        for key in ("eps", "weight_decay", "warmup_steps"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"optimizer.{key} must be 0 or more, got {getattr(self, key)}")
        if self.clip_norm is not None and not self.clip_norm >= 0:
            raise ConfigError(f"optimizer.clip_norm must be positive (or null: no clipping), got {self.clip_norm}")
        for key in ("min_lr_ratio", "decay_fraction"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"optimizer.{key} must be in [0, 1], got {getattr(self, key)}")


def make_schedule(config: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """The learning rate at each step: linear warmup from 0, then constant, cosine or wsd.

    cosine: cosine from ``lr`` down to ``lr x min_lr_ratio`` at ``total_steps``.
    wsd: warmup, stable at ``lr``, then linear decay to ``lr x min_lr_ratio`` over the last
    ``decay_fraction`` of the steps.
    """
    warmup = min(config.warmup_steps, total_steps)
    floor = config.lr * config.min_lr_ratio
    ramp = optax.linear_schedule(0.0, config.lr, warmup) if warmup else optax.constant_schedule(config.lr)
    if config.schedule == "constant":
        return optax.join_schedules([ramp, optax.constant_schedule(config.lr)], [warmup])
    if config.schedule == "cosine":
        cosine = optax.cosine_decay_schedule(config.lr, max(total_steps - warmup, 1), alpha=config.min_lr_ratio)
        return optax.join_schedules([ramp, cosine], [warmup])
    decay_start = max(warmup, total_steps - round(config.decay_fraction * total_steps))
    stable = optax.constant_schedule(config.lr)
    decay = optax.linear_schedule(config.lr, floor, max(total_steps - decay_start, 1))
    return optax.join_schedules([ramp, stable, decay], [warmup, decay_start])


def decay_mask(params: Any) -> Any:
    """True for the parameters weight decay applies to: matrices, not norms, biases or embeddings."""

    def decays(path: tuple, leaf: Any) -> bool:
        names = "/".join(str(getattr(p, "key", p)) for p in path).lower()
        return jnp.ndim(leaf) >= 2 and "embed" not in names

    return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(config: OptimizerConfig, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW with decoupled, masked weight decay behind global-norm clipping, and its schedule."""
    schedule = make_schedule(config, total_steps)
    adamw = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                        weight_decay=config.weight_decay, mask=decay_mask)
    clip = optax.clip_by_global_norm(config.clip_norm) if config.clip_norm else optax.identity()
    return optax.chain(clip, adamw), schedule
