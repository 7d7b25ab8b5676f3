"""``Run``: a run's parts, as ``theseus.recipe.assemble`` puts them together; the trainer loops
over one, and evaluate, sample, export and the dry run read one."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from theseus.base.axis import BATCH_MESH_AXES, ShardingPlan
from theseus.base.hardware import peak_flops
from theseus.base.mesh import on_devices
from theseus.data.config import DataConfig
from theseus.data.dataset_protocol import Dataset
from theseus.evaluation.evaluations import EvaluationConfig, Evaluations, evaluate
from theseus.model.lora import trainable
from theseus.sources.frozen_base import FrozenBase
from theseus.tasks.task import LossTask, Rollout
from theseus.training.batches import batch_sharding
from theseus.training.compiled import Compiled
from theseus.training.logger import LoggerConfig
from theseus.training.settings import Settings
from theseus.training.spec import RunSpec
from theseus.training.state import TrainState


@dataclass
class Run:
    """Everything a run is made of, resolved and checked: its spec and what was built from it."""

    spec: RunSpec  # the config resolved: settings, task, evaluations, logger, trainer.init_from's model, vocabulary
    model: nn.Module
    plan: ShardingPlan
    devices: list  # the mesh's devices (a planned target's, compile-only, for a dry run)
    compiled: Compiled
    dataset: Dataset | None  # the task's data (LossTask.dataset); None when not read (a planned run, sample, export)
    evaluations: Evaluations | None
    batch_share: tuple[int, int]  # (index, count): the share of every batch this process reads
    start: Callable[[Compiled, Callable[[str], None]], tuple[TrainState, dict | None]]  # a new run's state and
    # loader state, given what to say
    target: Any = None  # mesh.target's theseus.plan.target.Target, for a dry run
    base: FrozenBase | None = None  # a LoRA run's base from trainer.init_from: what its checkpoints name, not hold
    exports: bool = False  # theseus.export writes its model as a Hugging Face folder (its end offers the command)
    rollout: Rollout | None = None  # what makes the task's batches with the current params (task=grpo)

    @property
    def settings(self) -> Settings:
        return self.spec.settings

    @property
    def task(self) -> LossTask:
        return self.spec.task

    @property
    def evaluation(self) -> EvaluationConfig:
        return self.spec.evaluation

    @property
    def logging(self) -> LoggerConfig:
        return self.spec.logging

    @property
    def record(self) -> dict[str, Any]:
        """The config resolved, secrets scrubbed: what checkpoints, W&B and the logger record."""
        return self.spec.record

    @property
    def mesh_shape(self) -> dict[str, int]:
        return self.settings.mesh.shape(len(self.devices))

    @property
    def batch_parallel(self) -> int:
        """The devices a batch is split over: the product of the batch's mesh axes' sizes."""
        return math.prod(self.mesh_shape[axis] for axis in BATCH_MESH_AXES)

    @property
    def micro_batch(self) -> int:
        return self.settings.trainer.batch_size // self.settings.trainer.grad_accum

    @property
    def sequences_per_step(self) -> int:
        """The sequences of ``seq_len`` one optimizer step puts through the model (``dpo``: two a pair)."""
        return self.settings.trainer.batch_size * self.task.SEQUENCES

    @property
    def tokens_per_step(self) -> int:
        return self.sequences_per_step * self.model.seq_len

    @functools.cached_property
    def trainable(self) -> Any:
        """Per parameter, whether the train step differentiates and updates it (``optimizer.trainable``:
        a LoRA run's adapters alone)."""
        return trainable(self.compiled.target.params)

    @property
    def trained_params(self) -> int:
        """Parameters the train step updates."""
        return sum(leaf.size for leaf, trains in zip(jax.tree.leaves(self.compiled.target.params),
                                                     jax.tree.leaves(self.trainable), strict=True) if trains)

    @functools.cached_property
    def flops_per_step(self) -> int:
        """Model FLOPs of one optimizer step: ``model.flops(seq)`` per sequence, frozen weights'
        gradients left out (the step does not compute them), counted for the mesh's devices (the
        attention's kernel is the platform's)."""
        with jax.set_mesh(self.compiled.mesh):
            return self.model.flops(self.model.seq_len, trainable=self.trainable) * self.sequences_per_step

    @functools.cached_property
    def flops_note(self) -> str | None:
        """How ``flops_per_step`` counts what the convention leaves open (``Module.flops_note``)."""
        with jax.set_mesh(self.compiled.mesh):
            return self.model.flops_note(self.model.seq_len)

    @functools.cached_property
    def peak(self) -> tuple[float, str]:
        """FLOP/s per device for MFU, and where the figure comes from: ``trainer.peak_flops``,
        the target's or the device's table entry, or a measured calibration (a CPU)."""
        with jax.set_mesh(self.compiled.mesh):  # the dtype "auto" gives on the mesh's devices (a target's)
            dtype = self.model._activation_dtype
        given = self.settings.trainer.peak_flops
        if self.target and given is None and self.target.peak(dtype):
            return self.target.peak(dtype), f"table: {self.target.chip.name}"
        return peak_flops(self.devices[0] if self.target else jax.local_devices()[0], dtype, given)

    @property
    def prefetch(self) -> int:
        return prefetch(self.settings.data)

    def evaluate(self, params: Any, split: str = "val") -> dict[str, float]:
        """Every evaluation's metrics (``val_loss``, the task's ``val_NAME``, per source, multiple-choice
        and lm-eval tasks) on ``trainer.eval_batches`` batches of each validation split (the same
        each time; ``split="all"``: every example of a dataset of rows, pairs or conversations); a
        task with a rollout evaluates through it (GRPO: rewards of greedy completions of the
        validation prompts)."""
        if self.rollout is not None:
            return self.rollout.evaluate(params)
        return evaluate(params, self.evaluations, loss=self.compiled.eval_step, val_metrics=self.task.val_metrics,
                        sharding=batch_sharding(self.compiled.mesh), rules=self.plan.rules(),
                        share=self.batch_share, batch_size=self.micro_batch,
                        batches=self.settings.trainer.eval_batches, split=split)

    def score_reference(self, params: Any, batch: Any) -> np.ndarray:
        """The task's ``reference_outputs`` of one global batch of ``micro_batch`` examples under
        ``params`` (``batch``: this process's share), on every process."""
        sharding = batch_sharding(self.compiled.mesh)
        placed = jax.tree.map(lambda leaf: on_devices(leaf, sharding, (self.micro_batch, *leaf.shape[1:])), batch)
        with jax.set_mesh(self.compiled.mesh), nn.logical_axis_rules(self.plan.rules()):
            return np.asarray(jax.device_get(self.compiled.reference(params, placed)))


def prefetch(data: DataConfig) -> int:
    """Batches the loader's thread gathers ahead: ``data.prefetch``, else 8, or none on a CPU
    backend, where the thread would compete with the step for the same cores."""
    if data.prefetch is not None:
        return data.prefetch
    return 0 if jax.default_backend() == "cpu" else 8
