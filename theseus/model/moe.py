"""Mixture of experts: a feed-forward layer of ``n_experts`` MLPs, each token sent to ``top_k``.

Routing (in float32): router logits ``x @ W_router``, softmax over the experts, the top-k
probabilities kept (and renormalised to sum to 1 with ``norm_topk_prob``, as Mixtral always
does). Every sequence is its own routing group: each expert takes at most ``capacity`` of a
sequence's tokens (``ceil(capacity_factor x seq x top_k / n_experts)``; every token's first
choice is served before any second choice, earlier positions first); a choice over capacity is
dropped (the token's residual carries on) and counted. ``capacity_factor=null`` is dropless:
the capacity is the whole sequence. Groups of one sequence make routing, drops and losses the
same on every mesh.

Expert parallelism (GShard's sharding-constraint form): the tokens of a sequence are gathered
into their experts' slots ``[batch, expert, capacity, d_model]`` on the devices that hold the
sequence, then a sharding constraint moves the ``expert`` dimension onto the ``expert`` mesh
axis (XLA emits an all-to-all over it), the experts compute where their weights live, and the
reverse constraint brings the results back (another all-to-all) to be combined.

Bias-balanced routing (DeepSeek-V3's auxiliary-loss-free balancing), with
``bias_update_rate`` gamma > 0: a per-expert bias ``b_route: [expert]`` is added to the
routing probabilities to choose the top-k only (the gates stay the unbiased probabilities),
and after each step, outside the gradient, ``b_e -= gamma x sign(load_e - 1 / n_experts)``
(``route_bias_rule``): an overloaded expert is chosen less. The bias is a parameter whose
gradient channel carries the step's load imbalance (``_sow`` adds ``(b - stop_gradient(b)) x
imbalance`` to the loss: zero in value); the model declares it ``outside_optimizer`` (MoEGPT
does), so the train step takes that channel out before the norm, clipping and optimizer.

The layer sows into the ``auxiliary`` collection (``theseus.model.module.AUXILIARY``) what the
task adds to the loss and logs.

Shapes: ``x: [batch, seq, d_model]``.
"""

from __future__ import annotations

import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import (
    BATCH,
    DATA,
    EMBED,
    EXPERT,
    EXPERT_AXIS,
    EXPERT_BATCH,
    FSDP,
    MLP_HIDDEN,
    SEQ,
    ShardingPlan,
)
from theseus.config import NON_NEGATIVE, POSITIVE, RUNTIME, ConfigError, Range, configure, field
from theseus.model import architecture
from theseus.model.activations import activate, input_projections
from theseus.model.layers import MLP, Block, dense, param
from theseus.model.lora import adapt, adapters, lora_flops
from theseus.model.module import AUXILIARY, PENALTY, Module, Rule, model_of

ROUTE_BIAS = "b_route"  # the name of bias-balanced routing's per-expert bias (a bias: never weight-decayed)


class MoE(Module):
    """Top-k routed experts (SwiGLU or GELU MLPs without biases, as in Mixtral, Qwen2-MoE and
    DeepSeek), plus an optional shared expert that every token visits (Qwen2-MoE's, with its
    sigmoid gate; DeepSeek's n shared experts of width f are one of width n x f).

    ``x: [batch, seq, d_model] -> [batch, seq, d_model]``; weights ``w_gate`` (gated experts)
    and ``w_up``: ``[expert, d_model, d_ff]``, ``w_out: [expert, d_ff, d_model]``, ``router:
    [d_model, expert]``.
    """

    d_model: int = architecture.d_model()
    dense_d_ff: int | None = architecture.d_ff()
    activation: str = architecture.activation()
    dropout: float = architecture.dropout()
    init_std: float = architecture.init_std()
    n_experts: int = field("architecture.moe.n_experts", default=8, check=POSITIVE,
                           help="experts per mixture-of-experts layer")
    top_k: int = field("architecture.moe.top_k", default=2, check=POSITIVE, help="experts each token is sent to")
    expert_d_ff: int | None = field("architecture.moe.d_ff", default=None,
                                    check=Range(gt=0, says="positive (or null: architecture.d_ff)"),
                                    help="hidden width of each expert; None: architecture.d_ff")
    capacity_factor: float | None = field(
        "architecture.moe.capacity_factor", default=1.25,
        check=Range(gt=0, says="positive (or null: dropless)"),
        help="each expert takes at most capacity_factor x seq x top_k / n_experts tokens of a sequence, the rest "
             "are dropped (and counted); null: dropless (capacity = seq)",
    )
    norm_topk_prob: bool = field("architecture.moe.norm_topk_prob", default=True,
                                 help="renormalise the top-k routing probabilities to sum to 1 (Mixtral: true)")
    shared_d_ff: int = field("architecture.moe.shared_d_ff", default=0, check=NON_NEGATIVE,
                             help="hidden width of a shared expert every token visits; 0: none")
    shared_gate: bool = field("architecture.moe.shared_gate", default=False,
                              help="scale the shared expert by sigmoid(x @ w) (Qwen2-MoE)")
    aux_loss: float = field("architecture.moe.aux_loss", default=0.01, check=NON_NEGATIVE,
                            help="coefficient of the load-balancing loss (Switch/Mixtral; top_k at perfect balance)")
    z_loss: float = field("architecture.moe.z_loss", default=0.001, check=NON_NEGATIVE,
                          help="coefficient of the router z-loss, mean logsumexp(router logits)^2 (ST-MoE)",
                          role=RUNTIME)
    bias_update_rate: float = architecture.moe_bias_update_rate()

    shared_cls: ClassVar[type[Module]] = MLP

    def __post_init__(self):
        super().__post_init__()  # each field within its declared range
        if self.top_k > self.n_experts:
            raise ConfigError(f"architecture.moe.top_k must be in [1, architecture.moe.n_experts={self.n_experts}], "
                              f"got {self.top_k}")
        if self.shared_gate and not self.shared_d_ff:
            raise ConfigError("architecture.moe.shared_gate=true gates the shared expert, but "
                              "architecture.moe.shared_d_ff=0 gives none: set architecture.moe.shared_d_ff to its "
                              "width, or drop architecture.moe.shared_gate")

    @classmethod
    def components(cls) -> list[type]:
        return [cls.shared_cls]

    @property
    def sharding(self) -> ShardingPlan:
        """Experts over the ``expert`` mesh axis; dispatched sequences over the batch's other axes."""
        return ShardingPlan({EXPERT_AXIS: EXPERT, EXPERT_BATCH: (DATA, FSDP)})

    @property
    def hidden(self) -> int:
        return self.expert_d_ff or self.dense_d_ff or 4 * self.d_model

    @property
    def inputs(self) -> tuple[str, ...]:
        """Each expert's input projections (``input_projections``): gate and up, or up."""
        return input_projections(self.activation)

    def capacity(self, seq: int) -> int:
        """Slots of each expert per sequence of ``seq`` tokens (``seq``: dropless)."""
        if self.capacity_factor is None:
            return seq
        return min(seq, math.ceil(self.capacity_factor * seq * self.top_k / self.n_experts))

    def setup(self):
        init = nn.initializers.normal(self.init_std)
        e, d, f = self.n_experts, self.d_model, self.hidden
        into, out_of = ((d,), (EMBED,), (f,), (MLP_HIDDEN,)), ((f,), (MLP_HIDDEN,), (d,), (EMBED,))  # LoRA's
        self.lora_expert = adapters({**dict.fromkeys(self.inputs, into), "down": out_of},
                                    ("gate", "up", "down"), lead=((e,), (EXPERT_AXIS,)))  # each expert's own
        self.router = param(self, "router", init, (EMBED, None), (d, e))
        self.w_inputs = {name: param(self, f"w_{name}", init, (EXPERT_AXIS, EMBED, MLP_HIDDEN), (e, d, f))
                         for name in self.inputs}
        self.w_out = param(self, "w_out", init, (EXPERT_AXIS, MLP_HIDDEN, EMBED), (e, f, d))
        self.shared = configure(self.shared_cls, d_ff=self.shared_d_ff) if self.shared_d_ff else None
        self.gate = param(self, "shared_gate", init, (EMBED, None), (d, 1)) if self.shared and self.shared_gate else None
        self.route_bias = (param(self, ROUTE_BIAS, nn.initializers.zeros, (None,), (e,))
                           if self.bias_update_rate else None)
        if self.route_bias is not None:
            self._check_bias_is_updated()
        self.drop = nn.Dropout(self.dropout)

    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        batch, seq, _ = x.shape
        e, k, c = self.n_experts, self.top_k, self.capacity(seq)
        dtype = self._activation_dtype
        logits = jnp.einsum("bsd,de->bse", x.astype(jnp.float32), self.router.astype(jnp.float32))
        # routing stays on the devices of its sequences (left free, XLA splits experts here too)
        logits = nn.with_logical_constraint(logits, (BATCH, SEQ, None))
        probs = jax.nn.softmax(logits, axis=-1)  # [batch, seq, expert]
        if self.route_bias is None:
            weights, experts = _top_k(probs, k)  # [batch, seq, k]
        else:  # the bias chooses the experts; their gates stay unbiased
            _, experts = _top_k(probs + jax.lax.stop_gradient(self.route_bias.astype(jnp.float32)), k)
            weights = jnp.take_along_axis(probs, experts, axis=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdims=True)
        slot, kept = _slots(experts, e, c)  # [batch, seq, k]: e * c + position, or e * c when dropped

        # the token in each expert's slots (seq: none, a zero row), then the tokens to their experts
        token = jnp.repeat(jnp.arange(seq, dtype=jnp.int32), k)  # of each choice, [seq * k]
        # vmapped over sequences: a scatter whose batch dimension XLA keeps split (not gathered)
        slot_token = jax.vmap(lambda slots: jnp.full((e * c + 1,), seq, jnp.int32).at[slots].set(token))(
            slot.reshape(batch, -1))
        slot_token = nn.with_logical_constraint(slot_token[:, : e * c], (BATCH, None))
        padded = jnp.concatenate([x.astype(dtype), jnp.zeros((batch, 1, x.shape[-1]), dtype)], axis=1)
        dispatched = jnp.take_along_axis(padded, slot_token[..., None], axis=1)
        dispatched = nn.with_logical_constraint(dispatched, (BATCH, None, None)).reshape(batch, e, c, -1)
        # no embed axis named here: its rule (fsdp, for weights) must not take the batch's mesh axes
        out = self._experts(nn.with_logical_constraint(dispatched, (EXPERT_BATCH, EXPERT_AXIS, None, None)),
                            deterministic)
        out = nn.with_logical_constraint(out, (BATCH, None, None, EMBED)).reshape(batch, e * c, -1)

        out = jnp.concatenate([out, jnp.zeros((batch, 1, out.shape[-1]), dtype)], axis=1)
        chosen = jnp.take_along_axis(out, slot.reshape(batch, seq * k, 1), axis=1)
        chosen = nn.with_logical_constraint(chosen, (BATCH, None, None)).reshape(batch, seq, k, -1)
        y = jnp.einsum("bskd,bsk->bsd", chosen, jnp.where(kept, weights, 0.0).astype(dtype))
        if self.shared is not None:
            shared = self.shared(x, deterministic)
            if self.gate is not None:
                shared = shared * jax.nn.sigmoid(dense("bsd,do->bso", x, self.gate, None, jnp.float32)).astype(dtype)
            y = y + shared
        self._sow(logits, probs, experts, kept)
        y = nn.with_logical_constraint(y, (BATCH, None, EMBED))
        return self.drop(y, deterministic=deterministic)

    def _experts(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        """Each expert's MLP on its slots: ``x: [batch, expert, capacity, d_model]`` -> the same shape.
        Computed expert-major (``[expert, batch, capacity, ...]``: each expert's rows contiguous, one
        matrix product per expert), which a CPU runs faster than with the batch outermost."""
        dtype = self._activation_dtype
        x = x.transpose(1, 0, 2, 3)
        h = {name: dense("ebcd,edf->ebcf", x, w, None, dtype, self._matmul_dtype) for name, w in self.w_inputs.items()}
        h = activate(list(adapt(self.lora_expert, x, h, deterministic)), self.activation)
        h = nn.with_logical_constraint(h, (EXPERT_AXIS, EXPERT_BATCH, None, MLP_HIDDEN))
        out = dense("ebcf,efd->ebcd", h, self.w_out, None, dtype, self._matmul_dtype)
        (out,) = adapt(self.lora_expert, h, {"down": out}, deterministic)
        out = out.transpose(1, 0, 2, 3)
        return nn.with_logical_constraint(out, (EXPERT_BATCH, EXPERT_AXIS, None, None))

    def _check_bias_is_updated(self) -> None:
        """ConfigError unless the model this layer is in updates its routing bias outside the
        optimizer (a user's GPT with MoE layers declaring no rate): the optimizer would
        otherwise train it as a weight. A layer applied on its own is no model to train; one
        traced apart from its model (``model_of``: None) is checked where the model is whole,
        as its parameters are drawn."""
        root = model_of(self)
        if root is not None and root is not self and ROUTE_BIAS not in getattr(root, "outside_optimizer", dict)():
            raise ConfigError(
                f"architecture.moe.bias_update_rate is set, but {type(root).__name__} declares no bias_update_rate for "
                f"the train step to apply: subclass MoEGPT, or declare bias_update_rate: float = "
                f"field(\"architecture.moe.bias_update_rate\", default=0.0) on {type(root).__name__} and return "
                f"{{ROUTE_BIAS: route_bias_rule(rate)}} from its outside_optimizer()")

    def _sow(self, logits: jax.Array, probs: jax.Array, experts: jax.Array, kept: jax.Array) -> None:
        """Record this layer's routing: the weighted auxiliary loss and what the log shows.

        ``moe/load_e{i}``: expert i's share of the top-k choices (before capacity; they sum to 1);
        ``moe/aux_loss``: Switch/Mixtral's ``n_experts x sum_e (choices_e / tokens) x mean prob_e``;
        ``moe/z_loss``: mean ``logsumexp(logits)^2``; ``moe/dropped``: the fraction of choices
        over capacity; ``moe/bias_e{i}``: bias-balanced routing's bias, whose gradient is
        ``load - 1 / n_experts``. The train step averages each over the MoE layers.
        """
        chosen = jax.nn.one_hot(experts, self.n_experts, dtype=jnp.float32).sum(-2)  # [batch, seq, expert]
        per_token = chosen.mean((0, 1))
        balance = self.n_experts * jnp.sum(per_token * probs.mean((0, 1)))
        z = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
        load = per_token / self.top_k
        routing = {PENALTY: self.aux_loss * balance + self.z_loss * z, "moe/aux_loss": balance, "moe/z_loss": z,
                   "moe/dropped": (~kept).astype(jnp.float32).mean(), **_per_expert("moe/load_e", load)}
        if self.route_bias is not None:
            bias = self.route_bias.astype(jnp.float32)
            imbalance = jax.lax.stop_gradient(load - 1 / self.n_experts)
            routing[PENALTY] += jnp.sum((bias - jax.lax.stop_gradient(bias)) * imbalance)
            routing.update(_per_expert("moe/bias_e", bias))
        self.sow(AUXILIARY, "routing", routing)

    def flops(self, seq: int) -> int:
        """The router (d_model x experts) for every token, the ``top_k`` experts each token
        visits (not all of them; capacity's empty slots are not counted), the shared expert."""
        visits = self.top_k * seq  # tokens the experts see, spread over them: each expert's weights meet a share
        experts = sum(self.dense_flops(f"w_{name}", visits / self.n_experts) for name in (*self.inputs, "out"))
        shared = self.shared.flops(seq) + (self.dense_flops("shared_gate", seq) if self.gate is not None else 0) \
            if self.shared else 0
        return self.dense_flops("router", seq) + experts + lora_flops(self.lora_expert, visits) + shared


def _top_k(probs: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``jax.lax.top_k`` over the last axis by ``k`` argmaxes (ties: the lower index first, as
    top_k): XLA partitions an argmax over the batch's devices, whereas CPU's TopK is gathered."""
    values, indices = [], []
    for _ in range(k):
        index = jnp.argmax(probs, axis=-1)
        values.append(jnp.take_along_axis(probs, index[..., None], axis=-1)[..., 0])
        indices.append(index)
        probs = jnp.where(jax.nn.one_hot(index, probs.shape[-1], dtype=bool), -jnp.inf, probs)
    return jnp.stack(values, -1), jnp.stack(indices, -1).astype(jnp.int32)


def _slots(experts: jax.Array, n_experts: int, capacity: int) -> tuple[jax.Array, jax.Array]:
    """Each choice's slot among its expert's ``capacity``: ``experts: int[batch, seq, k]`` ->
    ``(slot, kept)``, ``slot = expert x capacity + position`` (``n_experts x capacity`` when
    over capacity) and ``kept: bool``. Every token's first choice comes before any second
    choice (GShard's priority), then positions in order."""
    batch, seq, k = experts.shape
    ordered = jax.nn.one_hot(experts.transpose(0, 2, 1).reshape(batch, k * seq), n_experts, dtype=jnp.int32)
    position = ((jnp.cumsum(ordered, axis=1) - 1) * ordered).sum(-1)  # [batch, k * seq]
    position = position.reshape(batch, k, seq).transpose(0, 2, 1)
    kept = position < capacity
    return jnp.where(kept, experts * capacity + position, n_experts * capacity), kept


class MoEBlock(Block):
    """A Block whose feed-forward is a mixture of experts."""

    mlp_cls: ClassVar[type[Module]] = MoE


def _per_expert(prefix: str, values: jax.Array) -> dict[str, jax.Array]:
    """``values: [expert]`` as scalars named ``{prefix}{i}``."""
    return {f"{prefix}{i}": values[i] for i in range(values.shape[0])}


def route_bias_rule(rate: float) -> Rule:
    """DeepSeek-V3's bias update, ``b -= rate x sign(load imbalance)``: the routing bias's
    gradient is the imbalance (``MoE._sow``), so the rule reads it from there."""
    return lambda bias, imbalance: (bias - rate * jnp.sign(imbalance)).astype(bias.dtype)
