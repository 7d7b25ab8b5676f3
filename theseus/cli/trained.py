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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import flax.linen as nn
from jax.sharding import Mesh
from omegaconf import DictConfig, OmegaConf

from theseus.base.axis import ShardingPlan
from theseus.config import ConfigError, Snapshot, registry
from theseus.config.compose import compose
from theseus.data.tokenizer import JSON_FILE, NAMES, HFTokenizer, Tokenizer
from theseus.interop.hf_config import arch_of
from theseus.interop.init_from import KEY as INIT_FROM
from theseus.interop.init_from import model_choice
from theseus.interop.loading import load_params
from theseus.model.source import SAVED_CONFIG, ModelSource, parse_source
from theseus.recipe import assemble, resolve
from theseus.training.checkpoint import Checkpointer, require_base
from theseus.training.frozen_base import FrozenBase
from theseus.training.state import TrainState


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


def source_config(source: ModelSource, overrides: Sequence[str] = ()) -> DictConfig:
    """The config of a theseus run (the one its job ran) or of a Hugging Face folder or GGUF file
    (the default config, ``trainer.init_from`` set to it), with ``KEY=VALUE`` overrides (a
    group's choice, ``task=dpo``, is the run's ``choices`` record). Registers the modules the
    config may name."""
    if source.kind == "run":
        run = source.run_dir
        if run is None:
            raise ConfigError(f"{source} has no {SAVED_CONFIG} beside its checkpoints: give the folder a run wrote")
        require_base(run / "checkpoints")  # a LoRA run's base folder, before its config reads it
        registry.load()
        given = [f"{registry.RECORD}.{item}" if item.partition("=")[0] in registry.groups() else item
                 for item in overrides]
        return OmegaConf.merge(registry.read_saved(run / SAVED_CONFIG), OmegaConf.from_dotlist(given))
    cfg = compose([*model_choice(source, overrides), *overrides])  # checked: unknown keys, wrong types
    OmegaConf.update(cfg, INIT_FROM, str(source.path))
    return cfg


def checkpoint(source: ModelSource, step: int | None, target: TrainState,
               base: FrozenBase | None = None) -> tuple[TrainState, int]:
    """``(state, step)``: a run's checkpoint (``step``, else the one its path names, else the
    newest readable one) restored onto ``target`` (the state's layout; ``base``: a LoRA run's,
    which its checkpoints name); ConfigError when there is none."""
    checkpoints = Checkpointer(source.run_dir / "checkpoints", base=base)
    step = source.step if step is None else step
    if step is not None and step not in checkpoints.steps():
        raise ConfigError(f"{source.run_dir / 'checkpoints'} has no checkpoint of step {step}: saved steps are "
                          f"{', '.join(map(str, checkpoints.steps())) or 'none'}")
    restored = checkpoints.restore(target, step=step, report=lambda line: print(line, file=sys.stderr))
    if restored is None:
        raise ConfigError(f"{source.run_dir / 'checkpoints'} holds no readable checkpoint: train first")
    return restored[0], restored[3]


def trained_params(source: ModelSource, step: int | None, model: nn.Module, target: TrainState,
                   base: FrozenBase | None = None) -> tuple[Any, int | None]:
    """``(params, step)`` laid out as ``target.params``: a run's checkpoint (``step``, the one its
    path names, or the newest readable one; ``base``: its LoRA base), or a Hugging Face folder's
    or GGUF file's weights (step None)."""
    if source.kind == "run":
        state, at = checkpoint(source, step, target, base)
        return state.params, at
    if step is not None:
        raise ConfigError(f"--step {step}: {source.given} is {source.what}, which holds one set of weights "
                          f"(checkpoint steps are a theseus run's)")
    return load_params(source, arch_of(model), target.params), None


def load_trained(source: ModelSource | str | Path, step: int | None = None) -> Trained:
    """The model, parameters and tokenizer of ``source`` (a ModelSource, or a path to one): a
    run's checkpoint (``step``, the one its path names, or the newest readable one), or a Hugging
    Face folder's or GGUF file's weights, sharded over the config's mesh; ConfigError when
    there is none, or a folder lacks its tokenizer."""
    source = source if isinstance(source, ModelSource) else parse_source(source, key=None)
    spec = resolve(source_config(source))
    data = spec.settings.data
    if source.kind == "run":  # the run's own tokenizer (its data's: a char or bpe one is fitted to it)
        tokenizer = spec.task.tokenizer(data)
    elif data.tokenizer in NAMES:
        raise ConfigError(f"{source.given} has no {JSON_FILE}: save the model's tokenizer beside it "
                          f"(tokenizer.save_pretrained(folder) writes it)")
    else:
        tokenizer = HFTokenizer.from_file(data.tokenizer)
    run = assemble(spec, steps=None, tokenizer=tokenizer)
    params, at = trained_params(source, step, run.model, run.compiled.target, run.base)
    imported = spec.source
    return Trained(source, run.spec.values, run.model, params, tokenizer, run.compiled.mesh, run.plan, at,
                   imported if imported is not None and imported.imported else None)
