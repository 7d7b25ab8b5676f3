"""A trained model, from any model source: what sample, evaluate and export load.

    trained = load_trained(parse_source("outputs/tiny", key=None))   # a run's newest readable checkpoint
    trained = load_trained(parse_source("~/models/my-llama", key=None), step=None)  # or a folder, a .gguf
    logits = trained.model.apply({"params": trained.params}, tokens)

A theseus run gives its saved config (``.hydra/config.yaml``) and a checkpoint (the one its
path names, the newest readable one, or ``step``); a Hugging Face folder or GGUF file gives the
default config with ``trainer.init_from`` set to it (the architecture, the tokenizer and the
weights are its own). Either way the parameters land on the config's mesh over every device,
laid out by the model's sharding plan, as the trainer lays them out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import flax.linen as nn
from jax.sharding import Mesh

from theseus.base.axis import ShardingPlan
from theseus.config import ConfigError, Snapshot
from theseus.data.tokenizer import JSON_FILE, NAMES, HFTokenizer, Tokenizer
from theseus.interop.hf_config import arch_of
from theseus.recipe import assemble, resolve
from theseus.sources.model_source import ModelSource
from theseus.sources.parse import parse_source


@dataclasses.dataclass(frozen=True)
class Trained:
    """A trained model's parts, its parameters on their shards."""

    source: ModelSource  # where it came from: a run, a Hugging Face folder, a GGUF file
    cfg: Snapshot  # its config resolved: trainer.init_from's architecture applied, architecture.vocab_size set
    model: nn.Module
    params: Any  # laid out by ``plan`` on ``mesh``
    tokenizer: Tokenizer
    mesh: Mesh
    plan: ShardingPlan
    step: int | None  # the checkpoint's step; None: a Hugging Face folder's or GGUF file's weights
    base: ModelSource | None  # the Hugging Face model the run started from (its vocabulary, special tokens)


def load_trained(source: ModelSource | str | Path, step: int | None = None) -> Trained:
    """The model, parameters and tokenizer of ``source`` (a ModelSource, or a path to one): a
    run's checkpoint (``step``, the one its path names, or the newest readable one), or a Hugging
    Face folder's or GGUF file's weights, sharded over the config's mesh; ConfigError when
    there is none, or a folder lacks its tokenizer."""
    source = source if isinstance(source, ModelSource) else parse_source(source, key=None)
    spec = resolve(source.config())
    data = spec.settings.data
    if not source.imported:  # the run's own tokenizer (its data's: a char or bpe one is fitted to it)
        tokenizer = spec.task.tokenizer(data)
    elif data.tokenizer in NAMES:
        raise ConfigError(f"{source.given} has no {JSON_FILE}: save the model's tokenizer beside it "
                          f"(tokenizer.save_pretrained(folder) writes it)")
    else:
        tokenizer = HFTokenizer.from_file(data.tokenizer)
    run = assemble(spec, steps=None, tokenizer=tokenizer)
    params, at = source.trained_params(step, arch_of(run.model), run.compiled.target, run.base)
    imported = spec.source
    return Trained(source, run.spec.values, run.model, params, tokenizer, run.compiled.mesh, run.plan, at,
                   imported if imported is not None and imported.imported else None)
