"""A run's spec: a composed config resolved once into the typed parts every command builds from.

    spec = resolve(cfg, run_dir)     # theseus.recipe: trainer.init_from's model and values, settings, task: checked
    run = assemble(spec)             # theseus.recipe: devices, data, model, compiled steps

``theseus.recipe.resolve`` reads the model ``trainer.init_from`` names (a ``ModelSource``) and what it
determines (its architecture and tokenizer: ``derived``), lays those over the composed config
once and resolves the result (``resolved``, plain values: what every part is configured from,
passed explicitly as ``values``), configures each group's settings, the task, the evaluations and
the logger, each checked as it is configured.

The vocabulary is the one value a run may take from its data (``char`` is fitted to the corpus,
``bpe`` trained on it, a shard folder records its own): it is set in one place,
``with_vocabulary``, once the tokenizer is known (the data's, read by ``assemble``; the model's,
when it is loaded to sample or export; a planned run's, which reads no data). The spec a ``Run``
holds has it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from theseus.config import Snapshot, configured
from theseus.config.context import is_checked
from theseus.evaluation.evaluations import EvaluationConfig
from theseus.sources.model_source import ModelSource
from theseus.tasks.task import Task, task_class
from theseus.training.logger import LoggerConfig, scrub, secrets
from theseus.training.settings import Settings, Values, configure_settings, vocab_size

VOCAB = "architecture.vocab_size"


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What a composed config resolves to: the run's parts before devices, data and model."""

    composed: DictConfig  # the config as composed and checked, unchanged (a resumed run's is compared with it)
    derived: Mapping[str, Any]  # what the run derives (dotted keys): trainer.init_from's architecture and
    # tokenizer, and architecture.vocab_size once the tokenizer is known (``with_vocabulary``)
    resolved: Mapping[str, Any]  # composed with derived laid over it, interpolations resolved (plain values)
    source: ModelSource | None  # the model trainer.init_from names (None: the run is initialised)
    settings: Settings
    task: Task
    evaluation: EvaluationConfig
    logging: LoggerConfig
    declared_vocab: int | None  # architecture.vocab_size as given (None: the tokenizer's, padded)
    run_dir: Path | None = None  # the directory it trains in (None: a dry run's, sample's, evaluate's)

    @functools.cached_property
    def values(self) -> Snapshot:
        """``resolved`` as the configuration the model's modules are built from."""
        return Snapshot(self.resolved, checked=is_checked(self.composed))

    @functools.cached_property
    def record(self) -> dict[str, Any]:
        """``resolved``, secrets scrubbed: what checkpoints, W&B and the logger record."""
        return scrub(self.resolved, secrets())

    @property
    def vocab_size(self) -> int | None:
        """``architecture.vocab_size`` as derived (None until the tokenizer is known)."""
        return self.derived.get(VOCAB)

    def with_vocabulary(self, tokens: int) -> RunSpec:
        """This spec completed with the vocabulary of a tokenizer of ``tokens`` tokens: the one
        declared (checked to hold them), else theirs padded (``settings.vocab_size``)."""
        vocab = vocab_size(tokens, self.declared_vocab)
        architecture = {**self.resolved.get("architecture", {}), "vocab_size": vocab}
        return dataclasses.replace(self, derived={**self.derived, VOCAB: vocab},
                                   resolved={**self.resolved, "architecture": architecture})


def configure_parts(values: Values) -> tuple[Settings, Task, EvaluationConfig, LoggerConfig]:
    """The settings (trainer, optimizer, data, mesh), task, evaluations and logger ``values``
    give, each checked as it is configured: what needs neither devices nor data."""
    values = Snapshot.of(values)
    return (configure_settings(values), configured(task_class(values), values), configured(EvaluationConfig, values),
            configured(LoggerConfig, values))
