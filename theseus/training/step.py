"""The pure train and eval steps; the trainer jits them once with their shardings.

A batch arrives as ``batch: [grad_accum, micro_batch, *example]`` (the task's example, a pytree
whose every leaf leads with those axes: for ``lm``, ``int32 [seq + 1]`` token windows; for
``dpo``, a pair's tokens, completion masks and reference log-probs); the task's ``loss_and_metrics`` scores one
micro-batch (its metrics, such as a mixture of experts' routing, are averaged like the loss).
Gradients of the micro-batches are summed in a ``lax.scan`` so memory holds one micro-batch of
activations at a time; each micro-batch's loss is scaled by 1 / grad_accum first, so the sum
is the mean. Parameters the model updates ``outside_optimizer`` (a mixture of experts' routing
biases) have their gradients taken out before clipping and the optimizer, and their rules
applied after the update. Only the ``trainable`` params are differentiated (a static mask; LoRA:
the adapters), the others closed over as constants: no weight gradient is computed for a frozen
base, ``grad_norm`` and clipping cover the trainable params alone, and the frozen ones leave the
step as they came, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from theseus.model.layers import leaf_name
from theseus.model.module import Rule
from theseus.tasks.task import LossTask
from theseus.training.state import TrainState

OPTIMIZER_UPDATE = "optimizer_update"  # the name scope of the update after the gradients (dry run: traffic rows)


def train_step(state: TrainState, batch: Any, dropout_key: jax.Array, *, model: nn.Module, task: LossTask,
               tx: optax.GradientTransformation, schedule: optax.Schedule, skip_nonfinite: bool = False,
               trainable: Callable[[Any], Any] | None = None) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step over ``grad_accum`` micro-batches; returns the new state and metrics.

    ``trainable``: params -> a mask of Python bools, the leaves to differentiate and update
    (None: every leaf). An update whose loss or gradients are not finite is never applied. The
    first such step is recorded; unless ``skip_nonfinite``, every later update is refused too,
    so the parameters stay the last good ones until the trainer stops the run (the optimizer
    state, never saved after that step, is then left as it comes: guarding it too costs a pass
    over the moments).
    """
    step_key = jax.random.fold_in(dropout_key, state.step)
    n_micro = jax.tree.leaves(batch)[0].shape[0]
    mask = trainable(state.params) if trainable else jax.tree.map(lambda _: True, state.params)
    train, frozen = partition(state.params, mask)

    def micro_loss(params, micro: Any, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        loss, metrics = task.loss_and_metrics(model, combine(params, frozen), micro, key)
        return loss / n_micro, jax.tree.map(lambda m: m / n_micro, metrics)  # summed over micro-batches: the mean

    def accumulate(carry, inputs):
        loss_sum, grad_sum, metric_sum = carry
        index, micro = inputs
        (loss, metrics), grads = jax.value_and_grad(micro_loss, has_aux=True)(
            train, micro, jax.random.fold_in(step_key, index))
        return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads), jax.tree.map(jnp.add, metric_sum, metrics)), None

    zeros = jax.tree.map(jnp.zeros_like, train)
    no_metrics = jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype),
                              jax.eval_shape(micro_loss, train, jax.tree.map(lambda x: x[0], batch), step_key)[1])
    (loss, grads, task_metrics), _ = jax.lax.scan(accumulate, (jnp.zeros((), jnp.float32), zeros, no_metrics),
                                                  (jnp.arange(n_micro), batch))
    with jax.named_scope(OPTIMIZER_UPDATE):
        rules = model.outside_optimizer()
        grads, signals = _split(grads, rules)
        grad_norm = optax.global_norm(grads)
        # the optimizer sees the whole tree (its state is laid out so); a frozen leaf's zero gradient is dropped
        updates, opt_state = tx.update(combine(grads, jax.tree.map(jnp.zeros_like, frozen)), state.opt_state,
                                       state.params)
        new = _apply_rules(optax.apply_updates(train, partition(updates, mask)[0]), signals, rules)

        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        first = jnp.where((state.first_nonfinite == 0) & ~finite, state.step + 1, state.first_nonfinite)
        apply = finite if skip_nonfinite else finite & (first == 0)
        params = combine(jax.tree.map(lambda new, old: jnp.where(apply, new, old), new, train), frozen)
        if skip_nonfinite:  # training goes on: the moments must not take the NaN in
            opt_state = jax.tree.map(lambda new, old: jnp.where(apply, new, old), opt_state, state.opt_state)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                           nonfinite=state.nonfinite + (~finite).astype(jnp.int32), first_nonfinite=first)
    metrics = {"loss": loss, "grad_norm": grad_norm, "lr": schedule(state.step),
               "nonfinite_skipped": new_state.nonfinite, **task_metrics}
    return new_state, metrics


def partition(tree: Any, mask: Any) -> tuple[Any, Any]:
    """``(kept, rest)``: ``tree`` with None where ``mask`` is False, and with None where it is True."""
    return (jax.tree.map(lambda m, x: x if m else None, mask, tree),
            jax.tree.map(lambda m, x: None if m else x, mask, tree))


def combine(kept: Any, rest: Any) -> Any:
    """The tree ``partition`` split: each leaf from ``kept`` where it has one, else from ``rest``."""
    return jax.tree.map(lambda k, r: r if k is None else k, kept, rest, is_leaf=lambda x: x is None)


def _split(grads, rules: Mapping[str, Rule]):
    """``(grads, signals)``: the gradients of parameters named in ``rules`` zeroed in the first
    (the optimizer leaves a parameter of zero gradient where it is), all of them in the second."""
    if not rules:
        return grads, grads
    return jax.tree_util.tree_map_with_path(lambda path, g: jnp.zeros_like(g) if leaf_name(path) in rules else g,
                                            grads), grads


def _apply_rules(params, signals, rules: Mapping[str, Rule]):
    """Each parameter named in ``rules`` replaced by ``rule(param, its gradient)``."""
    if not rules:
        return params
    return jax.tree_util.tree_map_with_path(
        lambda path, p, g: rules[leaf_name(path)](p, g) if leaf_name(path) in rules else p, params, signals)


def eval_step(params, batch: Any, *, model: nn.Module, task: LossTask) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The task's mean loss of ``batch: [batch, *example]`` without dropout, and the metrics its
    evaluations log beside it (``LossTask.eval_loss_and_metrics``)."""
    return task.eval_loss_and_metrics(model, params, batch)


def reference_step(params, batch: Any, *, model: nn.Module, task: LossTask) -> Any:
    """What the task keeps of each example of ``batch: [batch, *example]`` under a reference
    model's ``params`` (``LossTask.reference_outputs``), computed once before training."""
    return task.reference_outputs(model, params, batch)
