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
               tx: optax.GradientTransformation, schedule: optax.Schedule, loss_fn: LossFn,
               skip_nonfinite: bool = False) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step over ``grad_accum`` micro-batches; returns the new state and metrics.

    An update whose loss or gradients are not finite is never applied. The first such step is
    recorded; unless ``skip_nonfinite``, every later update is refused too, so the state stays
    the last good one until the trainer stops the run.
    """
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
    loss, grads = loss_sum / n_micro, jax.tree.map(lambda g: g / n_micro, grad_sum)
    grad_norm = optax.global_norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)

    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    first = jnp.where((state.first_nonfinite == 0) & ~finite, state.step + 1, state.first_nonfinite)
    apply = finite if skip_nonfinite else finite & (first == 0)
    params, opt_state = jax.tree.map(lambda new, old: jnp.where(apply, new, old),
                                     (params, opt_state), (state.params, state.opt_state))
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                           nonfinite=state.nonfinite + (~finite).astype(jnp.int32), first_nonfinite=first)
    metrics = {"loss": loss, "grad_norm": grad_norm, "lr": schedule(state.step),
               "nonfinite_skipped": new_state.nonfinite}
    return new_state, metrics


def eval_step(params, tokens: jax.Array, *, model: nn.Module, loss_fn: LossFn) -> jax.Array:
    """Mean loss of ``tokens: int32 [batch, seq + 1]`` without dropout."""
    logits = model.apply({"params": params}, tokens[:, :-1], deterministic=True)
    return loss_fn(logits, tokens[:, 1:])
