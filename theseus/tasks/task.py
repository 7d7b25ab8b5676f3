"""Task: what a job optimises, chosen by ``task=NAME`` and registered as a model is.

    @register("task", "NAME")
    @dataclasses.dataclass(frozen=True)
    class MyTask(LossTask):
        def loss(self, model, params, batch, rng): ...

A ``LossTask`` is trained by ``theseus.training.Trainer``: it fixes what one example is and
the loss the optimizer descends. A ``JobTask`` runs the whole job itself (its own models and
fitting loop), as the ``regression`` task does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax

from theseus.config import ConfigError, Configurable
from theseus.config.registry import chosen_class
from theseus.data.config import DataConfig
from theseus.data.dataset import open_dataset
from theseus.data.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Task(Configurable):
    """A registered option of the ``task`` group; its fields are its config keys."""


@dataclasses.dataclass(frozen=True)
class LossTask(Task):
    """A task the trainer optimises by gradient steps on ``loss``."""

    def dataset(self, data: DataConfig) -> Any:
        """What the trainer draws batches of ``example`` from: ``open_dataset(data)`` (token
        windows), or a task's own (``sft``: conversations). It gives ``loader(split, seq_len,
        batch_size, seed, process_index, process_count, prefetch)``, ``n_tokens(split)``,
        ``tokenizer``, ``vocab_size`` and ``bytes_per_token``."""
        return open_dataset(data)

    def check_model(self, model: nn.Module) -> None:
        """ConfigError for a model this task cannot train, before the data is prepared (a
        model configured with a stand-in vocabulary, unbound). None by default."""

    def check_data(self, dataset: Any, seq_len: int) -> None:
        """ConfigError unless ``dataset`` can fill a window of ``seq_len + 1`` in each split (checked
        before compiling): here, each split holds that many tokens."""
        for split in ("train", "val"):
            if dataset.n_tokens(split) < seq_len + 1:
                raise ConfigError(f"the {split} split has {dataset.n_tokens(split)} tokens, fewer than one window of "
                                  f"architecture.seq_len+1={seq_len + 1}: lower architecture.seq_len, use more data or "
                                  f"raise data.val_fraction")

    def longest_window(self, dataset: Any) -> int:
        """The longest ``architecture.seq_len`` worth a window of ``dataset`` (a model's context
        is shortened to it to evaluate on little data): here, what each split's tokens fill."""
        return min(dataset.n_tokens(split) for split in ("train", "val")) - 1

    def tokenizer(self, data: DataConfig) -> Tokenizer:
        """The tokenizer of ``dataset(data)`` (what sampling and evaluating a run's checkpoint use)."""
        return self.dataset(data).tokenizer

    def example(self, seq_len: int) -> jax.ShapeDtypeStruct:
        """The shape and dtype of one example of a batch (the data yields batches of them)."""
        raise NotImplementedError

    def loss(self, model: nn.Module, params: Any, batch: jax.Array, rng: jax.Array | None) -> jax.Array:
        """The mean loss of ``batch: [batch, *example]``, a float32 scalar. ``rng`` is the dropout
        key while training, None at evaluation (deterministic)."""
        raise NotImplementedError

    def loss_and_metrics(self, model: nn.Module, params: Any, batch: jax.Array,
                         rng: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """What a train step descends and what it logs beside it: ``(loss, metrics)``, metrics
        being float32 scalars (means over the batch). By default ``loss`` and none."""
        return self.loss(model, params, batch, rng), {}

    def val_metrics(self, val_loss: float, bytes_per_token: float | None) -> dict[str, float]:
        """The metrics logged at an evaluation, from the mean validation loss."""
        return {"val_loss": val_loss}


@dataclasses.dataclass(frozen=True)
class JobTask(Task):
    """A task that runs the whole job itself instead of the trainer."""

    def run(self, cfg: Any, run_dir: Path) -> float:
        """Run the job under the composed ``cfg``, writing into ``run_dir``; returns its objective."""
        raise NotImplementedError


def task_class(cfg: Any) -> type[Task]:
    """The registered task class a composed config chose."""
    return chosen_class(cfg, "task")
