"""A run's steps compiled ahead of time for its mesh: the state's sharded layout, the train
step (with XLA's FLOPs and memory), the eval step and, for a task with a reference model, the
step scoring examples under it. The one place the jit boundaries are."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from theseus.base.axis import ShardingPlan
from theseus.base.mesh import compiler_options
from theseus.model.lora import trainable
from theseus.tasks.task import LossTask
from theseus.training.batches import batch_sharding
from theseus.training.metrics import memory_report, xla_flops
from theseus.training.optimizer import make_optimizer
from theseus.training.settings import Settings
from theseus.training.state import TrainState, sharded_init
from theseus.training.step import eval_step, reference_step, train_step


Steps = Literal["train", "eval"] | None  # which steps to compile: both, the eval step alone, none (a layout)


@dataclass
class Compiled:
    """The mesh, the state's layout and the compiled steps."""

    mesh: Mesh
    init: Any  # () -> TrainState, created sharded; (params laid out) -> the state around them
    target: TrainState  # ShapeDtypeStructs with shardings: what a checkpoint restores onto
    step: Any  # (state, batch [accum, micro, *example], key) -> (state, metrics); donates state. None: not compiled
    eval_step: Any  # (params, batch [micro, *example]) -> (loss, metrics). None: not compiled
    xla_flops: float | None  # XLA's count for one step, all devices
    memory: dict[str, int]  # XLA's memory analysis of the step, bytes per device ({}: no train step)
    seconds: float = 0.0  # how long the steps took to compile
    reference: Any = None  # (params, batch [micro, *example]) -> per-example outputs, replicated; jitted on first
    # use (a cached reference needs none). None: the task has no reference model


def compile_steps(model: nn.Module, task: LossTask, plan: ShardingPlan, mesh: Mesh, settings: Settings,
                  steps: Steps, announce: Callable[[], None] | None = None) -> Compiled:
    """The state's layout on ``mesh``; ``steps="train"``: the train and eval steps compiled,
    ``"eval"``: the eval step alone, None: neither (a checkpoint to read). ``announce()`` is
    called once the layout is known (the model built, its parameters fitting the mesh), before
    anything compiles."""
    s = settings.trainer
    devices = list(mesh.devices.flat)
    tx, schedule = make_optimizer(settings.optimizer, s.max_steps)
    init, target, shardings = sharded_init(model, tx, model.seq_len, s.seed, plan, mesh)
    if steps is None:
        return Compiled(mesh, init, target, None, None, None, {})
    if announce is not None:
        announce()
    replicated = NamedSharding(mesh, PartitionSpec())
    micro = s.batch_size // s.grad_accum
    tokens = batch_of(task.example(model.seq_len), (s.grad_accum, micro), batch_sharding(mesh, accumulated=True))
    eval_tokens = batch_of(task.example(model.seq_len), (micro,), batch_sharding(mesh))
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    step = jax.jit(functools.partial(train_step, model=model, task=task, tx=tx, schedule=schedule,
                                     skip_nonfinite=s.skip_nonfinite, trainable=trainable),
                   out_shardings=(shardings, replicated), donate_argnums=0)
    loss = jax.jit(functools.partial(eval_step, model=model, task=task), out_shardings=replicated)
    began = time.perf_counter()
    with jax.set_mesh(mesh), nn.logical_axis_rules(plan.rules()):
        options = compiler_options(devices)
        step = step.lower(target, tokens, key).compile(options) if steps == "train" else None
        loss = loss.lower(target.params, eval_tokens).compile(options)
    measured = xla_flops(step) if step is not None else None
    if measured is not None:  # XLA counts one device's share, and a scan's body once
        measured *= len(devices) * s.grad_accum
    reference = (jax.jit(functools.partial(reference_step, model=model, task=task), out_shardings=replicated)
                 if task.reference() is not None else None)
    return Compiled(mesh, init, target, step, loss, measured, memory_report(step) if step is not None else {},
                    time.perf_counter() - began, reference)


def batch_of(example: Any, lead: tuple[int, ...], sharding: NamedSharding) -> Any:
    """The batch of ``example`` (a pytree of ShapeDtypeStructs): each leaf led by the ``lead`` axes, laid
    out by ``sharding``."""
    return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct((*lead, *leaf.shape), leaf.dtype, sharding=sharding),
                        example)
