"""Optimizers (optax): the ``optimizer`` config group, one option per optimizer.

Every option shares what surrounds the update: global-norm clipping, the learning-rate
schedule (``optimizer.schedule``, ``warmup_steps``, ``min_lr_ratio``) and decoupled weight
decay on the weight matrices only (``decay_mask``). Each option declares its own fields;
a key that another option declares is refused by the chosen option's schema.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import optax.contrib

from theseus.config import FRACTION, NON_NEGATIVE, Configurable, Range, field
from theseus.config.registry import chosen_class, name_of
from theseus.model import lora
from theseus.model.layers import leaf_name


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(Configurable):
    """The settings every optimizer shares; each option subclasses it and adds its own."""

    lr: float = field("optimizer.lr", default=3e-4, check=Range(gt=0, fix="give a peak rate such as optimizer.lr=3e-4"),
                      help="peak learning rate")
    weight_decay: float = field(
        "optimizer.weight_decay", default=0.1, check=NON_NEGATIVE,
        help="decoupled weight decay x lr, on weight matrices only (not norms, biases, embeddings)",
    )
    clip_norm: float | None = field("optimizer.clip_norm", default=1.0,
                                    check=Range(ge=0, says="0 or more (or null: no clipping)"),
                                    help="global gradient-norm clip; null: off")
    schedule: str = field("optimizer.schedule", default="cosine", choices=("constant", "cosine", "wsd"),
                          help="learning-rate schedule")
    warmup_steps: int = field("optimizer.warmup_steps", default=100, check=NON_NEGATIVE, help="linear warmup steps")
    min_lr_ratio: float = field("optimizer.min_lr_ratio", default=0.1, check=Range(ge=0, le=1),
                                help="final lr as a fraction of lr (cosine, wsd)")
    decay_fraction: float = field("optimizer.decay_fraction", default=0.2, check=Range(ge=0, le=1),
                                  help="wsd: fraction of steps spent decaying")

    @property
    def name(self) -> str:
        """The option of the ``optimizer`` group this class is (``optimizer=NAME``)."""
        return name_of("optimizer", type(self))

    def direction(self) -> optax.GradientTransformation:
        """The optimizer's own preconditioning of the (clipped) gradient, before decay and lr."""
        raise NotImplementedError(f"{type(self).__name__} must define direction() or transform()")

    def transform(self, schedule: optax.Schedule) -> optax.GradientTransformation:
        """Gradient -> update: ``-lr(t) x (direction(g) + weight_decay x p)``, decay masked."""
        return optax.chain(self.direction(), optax.add_decayed_weights(self.weight_decay, mask=decay_mask),
                           optax.scale_by_learning_rate(schedule))


@dataclasses.dataclass(frozen=True)
class AdamW(OptimizerConfig):
    """AdamW (Loshchilov & Hutter): Adam moments with decoupled weight decay."""

    b1: float = field("optimizer.b1", default=0.9, check=FRACTION, help="Adam first-moment decay")
    b2: float = field("optimizer.b2", default=0.95, check=FRACTION, help="Adam second-moment decay")
    eps: float = field("optimizer.eps", default=1e-8, check=NON_NEGATIVE, help="Adam epsilon")

    def direction(self) -> optax.GradientTransformation:
        return optax.scale_by_adam(b1=self.b1, b2=self.b2, eps=self.eps)


@dataclasses.dataclass(frozen=True)
class Lion(OptimizerConfig):
    """Lion (Chen et al. 2023): the sign of an interpolated momentum; wants a 3-10x lower lr than AdamW."""

    b1: float = field("optimizer.b1", default=0.9, check=FRACTION, help="Lion: interpolation of momentum and gradient")
    b2: float = field("optimizer.b2", default=0.99, check=FRACTION, help="Lion: momentum decay")

    def direction(self) -> optax.GradientTransformation:
        return optax.scale_by_lion(b1=self.b1, b2=self.b2)


@dataclasses.dataclass(frozen=True)
class Adafactor(OptimizerConfig):
    """Adafactor (Shazeer & Stern 2018): factored second moments, update clipping, relative steps."""

    decay_rate: float = field("optimizer.decay_rate", default=0.8, check=Range(gt=0, le=1),
                              help="Adafactor: second-moment decay exponent")
    clipping_threshold: float | None = field("optimizer.clipping_threshold", default=1.0,
                                             check=Range(gt=0, says="positive (or null: off)"), help="Adafactor: clip each update's RMS to this; null: off")
    multiply_by_parameter_scale: bool = field("optimizer.multiply_by_parameter_scale", default=True,
                                              help="Adafactor: scale updates by each parameter block's RMS")
    min_dim_size_to_factor: int = field("optimizer.min_dim_size_to_factor", default=128, check=Range(ge=1),
                                        help="Adafactor: factor the moments of dimensions at least this large")
    momentum: float | None = field("optimizer.momentum", default=None, check=Range(ge=0, lt=1, says="in [0, 1) or null"),
                                   help="Adafactor: first-moment decay; null: none")

    def direction(self) -> optax.GradientTransformation:
        """optax.adafactor's chain, without its learning rate and its (lr-free) decay."""
        return optax.chain(
            optax.scale_by_factored_rms(decay_rate=self.decay_rate,
                                        min_dim_size_to_factor=self.min_dim_size_to_factor),
            optax.clip_by_block_rms(self.clipping_threshold) if self.clipping_threshold else optax.identity(),
            optax.scale_by_param_block_rms() if self.multiply_by_parameter_scale else optax.identity(),
            optax.ema(self.momentum, debias=False) if self.momentum else optax.identity(),
        )


@dataclasses.dataclass(frozen=True)
class SGD(OptimizerConfig):
    """Stochastic gradient descent with heavy-ball or Nesterov momentum."""

    momentum: float = field("optimizer.momentum", default=0.9, check=FRACTION, help="SGD momentum; 0: plain SGD")
    nesterov: bool = field("optimizer.nesterov", default=False, help="SGD: Nesterov momentum")

    def direction(self) -> optax.GradientTransformation:
        return optax.trace(decay=self.momentum, nesterov=self.nesterov) if self.momentum else optax.identity()


@dataclasses.dataclass(frozen=True)
class Muon(OptimizerConfig):
    """Muon (Jordan et al. 2024, ``optax.contrib.muon``): orthogonalised momentum for the weight
    matrices (exactly those ``decay_mask`` decays, with decoupled decay); AdamW without decay
    for embeddings, norms and biases. Both follow the shared schedule."""

    beta: float = field("optimizer.beta", default=0.95, check=FRACTION, help="Muon momentum decay")
    ns_steps: int = field("optimizer.ns_steps", default=5, check=Range(ge=1),
                          help="Muon: Newton-Schulz orthogonalisation steps")
    nesterov: bool = field("optimizer.nesterov", default=True, help="Muon: Nesterov momentum")
    adam_b1: float = field("optimizer.adam_b1", default=0.9, check=FRACTION,
                           help="Muon: first-moment decay of the Adam part")
    adam_b2: float = field("optimizer.adam_b2", default=0.999, check=FRACTION,
                           help="Muon: second-moment decay of the Adam part")

    def transform(self, schedule: optax.Schedule) -> optax.GradientTransformation:
        return optax.contrib.muon(
            schedule, ns_steps=self.ns_steps, beta=self.beta, nesterov=self.nesterov, adam_b1=self.adam_b1,
            adam_b2=self.adam_b2, weight_decay=self.weight_decay, weight_decay_mask=decay_mask,
            muon_weight_dimension_numbers=muon_dimensions,
        )


def optimizer_class(cfg: Any) -> type[OptimizerConfig]:
    """The registered optimizer class a composed config chose."""
    return chosen_class(cfg, "optimizer")


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


# A parameter's role is its name (the last dict key of its path; theseus's layers follow this):
# lookup tables are ``embedding``, norm gains ``scale``, biases ``bias``, ``b``, ``bq``, ``b_up``...
EMBEDDING, NORM, BIAS = re.compile(r"embedding"), re.compile(r"scale"), re.compile(r"bias|b|b[a-z]|b_\w+")


def role(path: tuple) -> str:
    """``embedding``, ``norm``, ``bias`` or ``weight``: what the parameter at ``path`` is."""
    name = leaf_name(path)
    for kind, pattern in (("embedding", EMBEDDING), ("norm", NORM), ("bias", BIAS)):
        if pattern.fullmatch(name):
            return kind
    return "weight"


def decay_mask(params: Any) -> Any:
    """True for the parameters weight decay applies to: the weight matrices, by role (name), not
    by shape (a bias ``bq: [heads, head_dim]`` is two-dimensional and still a bias)."""
    return jax.tree_util.tree_map_with_path(lambda path, leaf: role(path) == "weight", params)


# Muon's matrix view of theseus's multi-axis weights, ``x W = y``: (reduction axes, output
# axes), counted from the end so that stacked leading axes (layers, SwiGLU's gate/value) batch.
MUON_AXES = {"wq": (-3, (-2, -1)), "wk": (-3, (-2, -1)), "wv": (-3, (-2, -1)), "wo": ((-3, -2), -1)}


def muon_dimensions(params: Any) -> Any:
    """Per leaf: Muon's dimension numbers for a weight matrix (default ``[..., in, out]``), None
    (the Adam part) for embeddings, norms and biases."""

    def dims(path: tuple, leaf: Any) -> optax.contrib.MuonDimensionNumbers | None:
        if role(path) != "weight":
            return None
        return optax.contrib.MuonDimensionNumbers(*MUON_AXES.get(leaf_name(path), (-2, -1)))

    return jax.tree_util.tree_map_with_path(dims, params)


def fitted_boxes(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` whose state keeps a parameter's logical-axis box (``nn.Partitioned``) only where it
    fits: optax builds state by mapping over the boxed params, so a masked-out entry (Muon's
    ``MaskedNode``) or a factored moment (Adafactor's row and column statistics) would carry the
    axis names of an array it is not. Unboxed, such a leaf is replicated."""

    def fit(leaf: Any) -> Any:
        if isinstance(leaf, nn.Partitioned) and len(getattr(leaf.value, "shape", ())) != len(leaf.names):
            return leaf.value
        return leaf

    def init(params: Any) -> Any:
        return jax.tree.map(fit, tx.init(params), is_leaf=lambda x: isinstance(x, nn.Partitioned))

    return optax.GradientTransformation(init, tx.update)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """Gradients scaled by ``min(1, max_norm / norm)``, their global norm at most ``max_norm``
    (``optax.clip_by_global_norm`` to a float32 rounding). One factor multiplies every element:
    optax divides each by the norm, and XLA's CPU backend writes that quotient in a pass of its
    own rather than repeat a division in both of Adam's moments (2% of a 135M model's step)."""

    def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
        norm = optax.global_norm(updates)
        factor = jnp.minimum(1.0, max_norm / jnp.maximum(norm, jnp.finfo(norm.dtype).tiny))
        return jax.tree.map(lambda g: g * factor.astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(config: OptimizerConfig, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The chosen optimizer behind global-norm clipping, and its schedule."""
    schedule = make_schedule(config, total_steps)
    clip = clip_by_global_norm(config.clip_norm) if config.clip_norm else optax.identity()
    return fitted_boxes(adapters_only(optax.chain(clip, config.transform(schedule)))), schedule


def adapters_only(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` on the ``lora.trainable`` params alone (LoRA's adapters when the params have any): the
    frozen base gets no update, no decay and no optimizer state, and clipping sees the adapters'
    gradients only; ``tx`` itself for params without adapters."""
    frozen = optax.multi_transform({"adapter": tx, "frozen": optax.set_to_zero()}, lora.labels)

    def init(params: Any) -> Any:
        return (frozen if lora.has_adapters(params) else tx).init(params)

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        return (frozen if lora.has_adapters(updates) else tx).update(updates, state, params)

    return optax.GradientTransformation(init, update)
