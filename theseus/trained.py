"""A trained model, from a run directory or a Hugging Face folder: what sample, evaluate and export load.

    trained = load_trained(Path("outputs/tiny"))          # the run's newest readable checkpoint (step=N: that one)
    trained = load_trained(Path("~/models/my-llama"))     # config.json, its safetensors, tokenizer.json
    logits = trained.model.apply({"params": trained.params}, tokens)

A run directory gives its saved config (``.hydra/config.yaml``) and a checkpoint; a Hugging Face
folder gives the default config with ``trainer.init_from`` set to it (the architecture, the
tokenizer and the weights are the folder's). Either way the parameters land on the config's
mesh over every device, laid out by the model's sharding plan, as the trainer lays them out.
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
from theseus.config import ConfigError, configuration, configure, registry
from theseus.config.compose import compose, with_values
from theseus.data.tokenizer import JSON_FILE, HFTokenizer, Tokenizer
from theseus.interop.hf_config import CONFIG_FILE, arch_of
from theseus.interop.init_from import KEY as INIT_FROM
from theseus.interop.init_from import hf_folder, init_from_values, model_choice
from theseus.interop.loading import load_params
from theseus.recipe import assemble
from theseus.tasks.task import task_class
from theseus.training.checkpoint import Checkpointer, require_base, require_checkpoint
from theseus.training.frozen_base import FrozenBase
from theseus.training.settings import configure_settings
from theseus.training.state import TrainState

SAVED_CONFIG = Path(".hydra") / "config.yaml"


@dataclasses.dataclass(frozen=True)
class Trained:
    """A trained model's parts, its parameters on their shards."""

    source: Path  # the run directory or Hugging Face folder it came from
    cfg: DictConfig  # its config: trainer.init_from's architecture applied, architecture.vocab_size set
    model: nn.Module
    params: Any  # laid out by ``plan`` on ``mesh``
    tokenizer: Tokenizer
    mesh: Mesh
    plan: ShardingPlan
    step: int | None  # the checkpoint's step; None: a Hugging Face folder's weights
    hf_source: Path | None  # the Hugging Face folder the run started from (its vocabulary, special tokens)


def is_run_dir(path: Path) -> bool:
    return (path.expanduser() / SAVED_CONFIG).is_file()


def source_config(path: Path, overrides: Sequence[str] = ()) -> DictConfig:
    """The config of a run directory (the one its job ran) or of a Hugging Face folder (the
    default config, ``trainer.init_from`` set to the folder), with ``KEY=VALUE`` overrides;
    ConfigError when ``path`` is neither. Registers the modules the config may name."""
    path = path.expanduser()
    if is_run_dir(path):
        require_base(path / "checkpoints")  # a LoRA run's base folder, before its config reads it
        registry.load()
        return OmegaConf.merge(registry.read_saved(path / SAVED_CONFIG), OmegaConf.from_dotlist(list(overrides)))
    if (path / CONFIG_FILE).is_file():
        cfg = compose([*model_choice(path, overrides), *overrides])  # checked: unknown keys, wrong types
        OmegaConf.update(cfg, INIT_FROM, str(path.resolve()))
        return cfg
    raise ConfigError(f"{path} is neither a run directory ({SAVED_CONFIG}) nor a Hugging Face folder "
                      f"({CONFIG_FILE}): give the folder a run wrote or one save_pretrained wrote")


def checkpoint(run_dir: Path, step: int | None, target: TrainState,
               base: FrozenBase | None = None) -> tuple[TrainState, int]:
    """``(state, step)``: a run directory's checkpoint (the newest readable one, or ``step``)
    restored onto ``target`` (the state's layout; ``base``: a LoRA run's, which its checkpoints
    name); ConfigError when there is none."""
    checkpoints = Checkpointer(run_dir / "checkpoints", requested_step=step, base=base)
    if step is not None and step not in checkpoints.steps():
        raise ConfigError(f"{run_dir / 'checkpoints'} has no checkpoint of step {step}: saved steps are "
                          f"{', '.join(map(str, checkpoints.steps())) or 'none'}")
    restored = checkpoints.restore(target, step=step, report=lambda line: print(line, file=sys.stderr))
    if restored is None:
        raise ConfigError(f"{run_dir / 'checkpoints'} holds no readable checkpoint: train first")
    return restored[0], restored[3]


def trained_params(path: Path, step: int | None, model: nn.Module, target: TrainState,
                   base: FrozenBase | None = None) -> tuple[Any, int | None]:
    """``(params, step)`` laid out as ``target.params``: a run directory's checkpoint (the newest
    readable one, or ``step``; ``base``: its LoRA base), or a Hugging Face folder's weights (step None)."""
    path = path.expanduser()
    if is_run_dir(path):
        state, at = checkpoint(path, step, target, base)
        return state.params, at
    if step is not None:
        raise ConfigError(f"--step {step}: {path} is a Hugging Face folder, which holds one set of weights "
                          f"(checkpoint steps are a run directory's)")
    return load_params(path.resolve(), arch_of(model), target.params), None


def load_trained(path: Path, step: int | None = None) -> Trained:
    """The model, parameters and tokenizer of a run directory's checkpoint (the newest readable
    one, or ``step``) or of a Hugging Face folder, sharded over the config's mesh; ConfigError
    when there is none, or the folder lacks its tokenizer.json."""
    path = path.expanduser()
    require_checkpoint(path)
    cfg = source_config(path)
    if is_run_dir(path):  # the run's own tokenizer (its data's: a char or bpe one is fitted to it)
        with_init = with_values(cfg, init_from_values(cfg))
        with configuration(with_init):
            task = configure(task_class(with_init))
        tokenizer = task.tokenizer(configure_settings(with_init).data)
    else:
        tokenizer = _folder_tokenizer(path)
    run = assemble(cfg, steps=None, tokenizer=tokenizer)
    params, at = trained_params(path, step, run.model, run.compiled.target, run.base)
    return Trained(path, run.cfg, run.model, params, tokenizer, run.compiled.mesh, run.plan, at,
                   hf_folder(run.settings.trainer.init_from))


def _folder_tokenizer(folder: Path) -> Tokenizer:
    """A Hugging Face folder's own tokenizer.json; ConfigError when it has none."""
    if not (folder / JSON_FILE).is_file():
        raise ConfigError(f"{folder} has no {JSON_FILE}: save the model's tokenizer beside it "
                          f"(tokenizer.save_pretrained(folder) writes it)")
    return HFTokenizer.from_file(folder / JSON_FILE)
