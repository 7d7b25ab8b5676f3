"""Optimizer settings (optax): AdamW with clipping and a learning-rate schedule."""

from __future__ import annotations

import dataclasses

from theseus.config import Configurable, field, register


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
