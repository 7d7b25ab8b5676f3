"""Task: what a job optimises, chosen by ``task=NAME`` and registered as a model is.

    @register("task", "NAME")
    @dataclasses.dataclass(frozen=True)
    class MyTask(LossTask):
        def loss(self, model, params, batch, rng): ...

A ``LossTask`` is trained by ``theseus.training.Trainer``: it fixes what one example is (an
array, or a pytree of arrays: ``dpo``'s tokens beside float reference log-probs) and the loss the
optimizer descends. A task whose examples need a fixed model's outputs (``dpo``: the reference's
log-probs) names it by ``reference`` and computes them in ``reference_outputs``; the recipe loads
that model, has every example scored once before training, and the dataset keeps the results. A
task whose batches depend on the current params (GRPO's completions) makes them through its
``rollout``: the loader then yields what it needs (prompts), and before each step the rollout
turns them into the step's examples with the params the step starts from. A ``JobTask`` runs
the whole job itself (its own models and fitting loop), as the ``regression`` task does.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import flax.linen as nn
import jax
from jax.sharding import Mesh

from theseus.base.axis import LogicalRules
from theseus.config import ConfigError, Configurable, Snapshot, configured
from theseus.config.registry import chosen_class
from theseus.data.chat import ChatTemplate
from theseus.data.config import DataConfig
from theseus.data.dataset import open_dataset
from theseus.data.dataset_protocol import Dataset
from theseus.data.tokenizer import Tokenizer
from theseus.model.module import AUXILIARY, auxiliary
from theseus.sources.model_source import ModelSource


START = "start"  # LossTask.reference: the run's own starting weights


class BatchError(RuntimeError):
    """A batch the task cannot make from what it was given (GRPO: a reward function that raised):
    the trainer saves a checkpoint of the last step and stops the run with this one line."""


@dataclasses.dataclass(frozen=True)
class StepLayout:
    """Where and how a run's steps run: what a task making its own batches (``LossTask.rollout``) needs."""

    model: nn.Module
    mesh: Mesh
    rules: LogicalRules  # the model's
    batch_size: int  # examples a step, every process's together (trainer.batch_size)
    grad_accum: int
    share: tuple[int, int]  # (index, count): this process reads share index of count of every batch
    seed: int  # trainer.seed
    place: Callable[[Any], Any]  # this process's [batch_size / count, *example] -> the step's global batch
    start: Callable[[], Any] | None = None  # the params the run starts from, loaded when called


class Rollout(abc.ABC):
    """Makes a task's batches with the current params (``LossTask.rollout``): the trainer asks it
    for each step's examples, and its evaluations go through it."""

    @abc.abstractmethod
    def batch(self, params: Any, loader: Any, step: int) -> tuple[Any, dict[str, float]]:
        """The examples of the step after ``step``, ``[grad_accum, micro, *example]`` on the mesh,
        made with ``params`` from ``next(loader)`` (when it needs new data), and the metrics logged
        with that step (host floats). BatchError: it cannot make them (one line)."""

    @abc.abstractmethod
    def evaluate(self, params: Any) -> dict[str, float]:
        """The metrics of an evaluation of ``params`` (``val_loss`` among them)."""

    @property
    def samples(self) -> list[dict]:
        """A few examples of the latest evaluation (prompts, completions, scores), to show."""
        return []

    def get_state(self) -> Any:
        """What a checkpoint keeps so that a resumed run makes the batches this one would have
        (JSON-serialisable, the same on every process; every process calls it); None: nothing."""
        return None

    def set_state(self, state: Any) -> None:
        """Continue from ``get_state``'s ``state`` (None: a checkpoint saved none)."""


@dataclasses.dataclass(frozen=True)
class Task(Configurable):
    """A registered option of the ``task`` group; its fields are its config keys."""


@dataclasses.dataclass(frozen=True)
class LossTask(Task):
    """A task the trainer optimises by gradient steps on ``loss``."""

    # what ``theseus.evaluate`` scores of data its command line names (a model's, or a run's other
    # data): the validation split (``val``), or every example (``all``: a file of pairs given to
    # score); a run's own data, always its validation split, what the run's evaluations scored
    EVALUATE_SPLIT: ClassVar[str] = "val"
    SEQUENCES: ClassVar[int] = 1  # sequences of seq_len an example puts through the model (tokens, FLOPs per step)
    CHAT: ClassVar[bool] = False  # trains a chat model (its run's summary samples it with --chat)

    def dataset(self, data: DataConfig) -> Dataset:
        """What the trainer draws batches of ``example`` from: ``open_dataset(data)`` (token
        windows, which give ``n_tokens(split)`` too), or a task's own (``sft``: conversations)."""
        return open_dataset(data)

    def chats(self, dataset: Dataset) -> bool:
        """Whether the run trains a chat model on ``dataset`` (its summary samples it with --chat): ``CHAT``."""
        return self.CHAT

    def check_model(self, model: nn.Module) -> None:
        """ConfigError for a model this task cannot train, before the data is prepared (a
        model configured with a stand-in vocabulary, unbound). None by default."""

    def check_data(self, dataset: Dataset, seq_len: int) -> None:
        """ConfigError unless ``dataset`` can fill a window of ``seq_len + 1`` in each split (checked
        before compiling): here, each split holds that many tokens."""
        for split in ("train", "val"):
            if dataset.n_tokens(split) < seq_len + 1:
                raise ConfigError(f"the {split} split has {dataset.n_tokens(split)} tokens, fewer than one window of "
                                  f"architecture.seq_len+1={seq_len + 1}: lower architecture.seq_len, use more data or "
                                  f"raise data.val_fraction")

    def longest_window(self, dataset: Dataset) -> int:
        """The longest ``architecture.seq_len`` worth a window of ``dataset`` (a model's context
        is shortened to it to evaluate on little data): here, what each split's tokens fill."""
        return min(dataset.n_tokens(split) for split in ("train", "val")) - 1

    def tokenizer(self, data: DataConfig) -> Tokenizer:
        """The tokenizer of ``dataset(data)`` (what sampling and evaluating a run's checkpoint use)."""
        return self.dataset(data).tokenizer

    def example(self, seq_len: int) -> jax.ShapeDtypeStruct | dict[str, jax.ShapeDtypeStruct]:
        """The shape and dtype of one example of a batch (the data yields batches of them): a
        ``jax.ShapeDtypeStruct``, or a pytree of them (a dict), each leaf batched alike."""
        raise NotImplementedError

    @staticmethod
    def forward(model: nn.Module, params: Any, tokens: jax.Array, rng: jax.Array | None,
                **inputs: jax.Array) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(logits [batch, seq, vocab], penalty, metrics)``: ``model``'s forward pass over ``tokens:
        int32 [batch, seq]`` (and ``inputs``, e.g. ``segments``), dropout drawn from ``rng`` (None:
        deterministic), with what its layers sow as auxiliary losses (``auxiliary``: a float32 scalar
        penalty and its metrics; 0 and none where no layer sows)."""
        logits, sown = model.apply({"params": params}, tokens, deterministic=rng is None,
                                   rngs=None if rng is None else {"dropout": rng}, mutable=[AUXILIARY], **inputs)
        return (logits, *auxiliary(sown))

    def loss(self, model: nn.Module, params: Any, batch: Any, rng: jax.Array | None) -> jax.Array:
        """The mean loss of ``batch: [batch, *example]``, a float32 scalar. ``rng`` is the dropout
        key while training, None at evaluation (deterministic)."""
        raise NotImplementedError

    def loss_and_metrics(self, model: nn.Module, params: Any, batch: Any,
                         rng: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """What a train step descends and what it logs beside it: ``(loss, metrics)``, metrics
        being float32 scalars (means over the batch). By default ``loss`` and none."""
        return self.loss(model, params, batch, rng), {}

    def eval_loss_and_metrics(self, model: nn.Module, params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
        """What an evaluation scores a batch by, without dropout: ``(loss, metrics)``, logged as
        ``val_loss`` and ``val_NAME``. By default ``loss`` and no metrics (``lm``: the
        cross-entropy alone, without a mixture of experts' penalties)."""
        return self.loss(model, params, batch, None), {}

    def reference(self) -> ModelSource | str | None:
        """The model whose outputs each example needs (``reference_outputs``), computed once
        before training: ``START`` (the run's own start: ``trainer.init_from``'s weights, LoRA's
        adapters still zero), a model source, or None: none (the default)."""
        return None

    def reference_outputs(self, model: nn.Module, params: Any, batch: Any) -> Any:
        """Per-example values of ``batch: [batch, *example]`` under the reference's ``params``
        (arrays leading with ``batch``), which the dataset keeps and puts in the examples."""
        raise NotImplementedError

    def chat_template(self, data: DataConfig) -> ChatTemplate | None:
        """The chat template of the task's model, which an export writes beside its tokenizer: by
        default the tokenizer's own, if any (a chat model fine-tuned on text stays one); a task of
        conversations, the one it renders them with."""
        return ChatTemplate.own(data.tokenizer)

    def val_metrics(self, val_loss: float, bytes_per_token: float | None) -> dict[str, float]:
        """The metrics logged at an evaluation, from the mean validation loss."""
        return {"val_loss": val_loss}

    def check_batch(self, batch_size: int, grad_accum: int, processes: int) -> None:
        """ConfigError unless the task can make batches of ``trainer.batch_size`` (split into
        ``grad_accum`` micro-batches and over ``processes``); any, by default."""

    def rollout(self, layout: StepLayout, dataset: Dataset) -> Rollout | None:
        """What makes this task's batches from ``dataset``'s with the current params, or None (the
        default): the loader's batches are the examples."""
        return None


class OptionalChatTemplate:
    """For a task whose rows are strings or conversations (dpo's pairs, grpo's prompts)."""

    def chat_template(self, data: DataConfig) -> ChatTemplate | None:
        """The template conversational rows are rendered with (``ChatTemplate.find``), which an
        export writes and ``theseus.sample --chat`` uses; None when there is none (string rows
        need none, and the tokenizer holds none of its own)."""
        return ChatTemplate.found(data.tokenizer, data.chat_template)


@dataclasses.dataclass(frozen=True)
class JobTask(Task):
    """A task that runs the whole job itself instead of the trainer."""

    def run(self, cfg: Any, run_dir: Path) -> float:
        """Run the job under the composed ``cfg``, writing into ``run_dir``; returns its objective."""
        raise NotImplementedError


def task_class(cfg: Any) -> type[Task]:
    """The registered task class a composed config chose."""
    return chosen_class(cfg, "task")


def chat_template_of(cfg: Any) -> ChatTemplate | None:
    """The chat template of a composed config's run, which its export writes (``LossTask.chat_template``:
    ``task=sft``'s and ``task=dpo``'s, the one they render with; another's, its tokenizer's own)."""
    values = Snapshot.of(cfg)
    task, data = configured(task_class(values), values), configured(DataConfig, values)
    return task.chat_template(data) if isinstance(task, LossTask) else None
