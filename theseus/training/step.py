"""The pure train and eval steps; the trainer jits them once with their shardings.

A batch arrives as ``tokens: int32 [grad_accum, micro_batch, seq + 1]``: inputs are
``tokens[..., :-1]``, next-token targets ``tokens[..., 1:]``. Gradients of the micro-batches
are averaged in a ``lax.scan`` so memory holds one micro-batch of activations at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from theseus.training.state import TrainState

LossFn = Callable[[jax.Array, jax.Array], jax.Array]  # (logits, targets) -> mean loss


def train_step(state: TrainState, tokens: jax.Array, dropout_key: jax.Array, *, model: nn.Module,
               tx: optax.GradientTransformation, schedule: optax.Schedule, loss_fn: LossFn
               ) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step over ``grad_accum`` micro-batches; returns the new state and metrics."""
    step_key = jax.random.fold_in(dropout_key, state.step)

    def micro_loss(params, micro: jax.Array, key: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, micro[:, :-1], deterministic=False, rngs={"dropout": key})
        return loss_fn(logits, micro[:, 1:])

    def accumulate(carry, inputs):
        loss_sum, grad_sum = carry
        index, micro = inputs
        loss, grads = jax.value_and_grad(micro_loss)(state.params, micro, jax.random.fold_in(step_key, index))
        return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

    n_micro = tokens.shape[0]
    zeros = jax.tree.map(jnp.zeros_like, state.params)
    (loss_sum, grad_sum), _ = jax.lax.scan(accumulate, (jnp.zeros((), jnp.float32), zeros),
                                           (jnp.arange(n_micro), tokens))
    grads = jax.tree.map(lambda g: g / n_micro, grad_sum)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                              opt_state=opt_state)
    metrics = {"loss": loss_sum / n_micro, "grad_norm": optax.global_norm(grads), "lr": schedule(state.step)}
    return new_state, metrics


def eval_step(params, tokens: jax.Array, *, model: nn.Module, loss_fn: LossFn) -> jax.Array:
    """Mean loss of ``tokens: int32 [batch, seq + 1]`` without dropout."""
    logits = model.apply({"params": params}, tokens[:, :-1], deterministic=True)
    return loss_fn(logits, tokens[:, 1:])
