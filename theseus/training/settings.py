"""A config's values configured into a run's parts: each group's settings, then the model and
its sharding plan, with the tokenizer's vocabulary.

    settings = configure_settings(values)                  # trainer, optimizer, data, mesh: checked
    declared = check_model(values)                         # the model's own checks, before the data
    vocab = vocab_size(tokenizer.vocab_size, declared)     # the run derives it
    model, plan = configure_model(values, settings.mesh, vocab)

``values``: a composed config, or the resolved Snapshot a ``RunSpec`` holds (``theseus.training.spec``,
through which every run is resolved: to train, plan, evaluate, sample or export), so a checkpoint
is read with the model and layout that wrote it.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
from omegaconf import DictConfig

from theseus.base.axis import ShardingPlan
from theseus.base.mesh import MeshConfig
from theseus.config import ConfigError, Configurable, Snapshot, configured
from theseus.config.registry import model_class
from theseus.data.config import DataConfig
from theseus.model import architecture
from theseus.tasks.task import LossTask, task_class
from theseus.training.config import TrainerConfig
from theseus.training.optimizer import OptimizerConfig, optimizer_class

VOCAB_MULTIPLE = 128  # a vocabulary taken from the tokenizer is padded to a multiple of this


@dataclasses.dataclass(frozen=True)
class Settings:
    """The settings of a run's config groups, each checked (its own ranges) when configured."""

    trainer: TrainerConfig
    optimizer: OptimizerConfig  # the chosen optimizer's (``optimizer_class``)
    data: DataConfig
    mesh: MeshConfig


@dataclasses.dataclass(frozen=True)
class Vocabulary(Configurable):
    """The vocabulary as the config declares it, read before the model (whose own check
    refuses it unset): None takes the tokenizer's, padded (``vocab_size``)."""

    size: int | None = architecture.vocab_size()


@dataclasses.dataclass(frozen=True)
class Context(Configurable):
    """The context length as the config declares it, read without building the model."""

    seq_len: int = architecture.seq_len()


Values = DictConfig | Snapshot  # a composed config, or its resolved values (``RunSpec.values``)


def configure_settings(values: Values) -> Settings:
    """The trainer, optimizer, data and mesh settings ``values`` give, configured in that order
    (the first bad key is the one reported)."""
    values = Snapshot.of(values)
    return Settings(configured(TrainerConfig, values), configured(optimizer_class(values), values),
                    configured(DataConfig, values), configured(MeshConfig, values))


def check_model(values: Values) -> int | None:
    """The model's own checks (its keys' ranges, shapes that must divide) and the task's of it
    (``LossTask.check_model``), raised before the data is prepared, which can take minutes;
    returns ``architecture.vocab_size`` as declared (None: the tokenizer's).

    The vocabulary is a stand-in here when undeclared (VOCAB_MULTIPLE): the run's own is known
    only once the data is prepared whenever the tokenizer comes from the corpus (``char`` is
    fitted to it, ``bpe`` trained on it may hold fewer tokens than ``data.bpe_vocab_size``, a
    shard folder records its own in meta.json). Every configurable part of the model's tree is
    built too, as its ``setup()`` would build it (the checks of a mixture's experts, of LoRA's
    settings). Configuring allocates nothing; ``configure_model`` then configures the run's
    model once, with the vocabulary.
    """
    values = Snapshot.of(values)
    declared = declared_vocab(values)
    model = configured(model_class(values), values, vocab_size=declared or VOCAB_MULTIPLE)
    task = configured(task_class(values), values)
    for part in type(model).gather()[1:]:
        if issubclass(part, nn.Module):
            model.detached(part)
        else:
            configured(part, model.own_configuration())
    if isinstance(task, LossTask):
        task.check_model(model)  # the model takes what the task passes it (sft: segments=)
    return declared


def declared_vocab(values: Values) -> int | None:
    """``architecture.vocab_size`` as ``values`` declare it (None: the tokenizer's, padded)."""
    return configured(Vocabulary, values).size


def configure_model(values: Values, mesh: MeshConfig, vocab: int) -> tuple[nn.Module, ShardingPlan]:
    """``(model, plan)``: the model ``values`` configure, of ``vocab`` tokens (``vocab_size``; its
    children built with it too), and its sharding plan with ``mesh``'s overrides applied."""
    model = configured(model_class(values), values, vocab_size=vocab)
    return model, mesh.apply(model.plan())


def vocab_size(tokenizer_size: int, declared: int | None) -> int:
    """``architecture.vocab_size`` for a tokenizer of ``tokenizer_size`` tokens: ``declared``
    (checked to hold them), else the tokenizer's size rounded up to a multiple of VOCAB_MULTIPLE,
    so that the embedding splits evenly over tensor-parallel devices and matmuls tile well
    (nanoGPT pads GPT-2's 50257 to 50304 for the same reason); the extra rows are never targets.
    """
    if declared is not None and declared < tokenizer_size:
        raise ConfigError(
            f"architecture.vocab_size={declared} is smaller than the tokenizer's vocabulary ({tokenizer_size}): "
            f"set architecture.vocab_size>={tokenizer_size} or leave it unset"
        )
    return declared or -(-tokenizer_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
