"""A theseus run or checkpoint as a model source: its directory, its ``checkpoints/`` or one step's folder.

    source = parse_source("outputs/tiny")     # a TheseusRun
    source.run_dir, source.step               # the folder holding .hydra/; the step its path names (None: newest)

As ``trainer.init_from`` it gives the architecture it was trained with: every
``architecture.*`` key and ``data.tokenizer`` left at its default take the run's value; any
other key is free to change (learning rate, schedule, steps, data). A new run starts from its
weights (with ``trainer.init_optimizer`` its optimizer state, with ``trainer.init_data`` its
data position), at step 0.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import NamedSharding, PartitionSpec
from omegaconf import DictConfig, OmegaConf
from optax import ScaleByScheduleState

from theseus.config import ConfigError, registry
from theseus.config.compose import with_values
from theseus.config.registry import chosen, chosen_schema, load, names, read_saved
from theseus.config.schema import flatten
from theseus.model import lora
from theseus.model.module import param_shapes
from theseus.sources.checkpoint_folders import SAVED_CONFIG, run_of, saved_base, step_dir
from theseus.sources.checkpoint_reader import CheckpointReader, path_shapes, read_with_fresh_adapters, saved_params
from theseus.sources.frozen_base import FrozenBase, require_base
from theseus.sources.in_config import init_from_values, init_source
from theseus.sources.model_source import ModelSource, Say, StartFrom, StateMaker, widths


class TheseusRun(ModelSource, kind="run"):
    """A run theseus trained, or its checkpoints."""

    what = "a theseus run"
    imported = False

    @property
    def run_dir(self) -> Path | None:
        return run_of(self.path)

    @property
    def step(self) -> int | None:
        """The step its path names (its step folder), else None: the newest. (A run directory
        named by a number, as a multirun's are, names no step.)"""
        named = self.path.name.isdigit() and not (self.path / "checkpoints").is_dir()
        return int(self.path.name) if named else None

    @property
    def base_path(self) -> Path:
        """The step folder it names, else its newest."""
        return step_dir(self.path)

    def model_choice(self) -> list[str]:
        """The model it was trained with (``[]`` for the primary config's own, or a checkpoint
        without its run's config); ConfigError when no module imported here registers it."""
        run = self.run_dir
        if run is None:
            return []
        load()  # the user's modules: their models are options
        name = chosen(read_saved(run / SAVED_CONFIG), "model")
        if name == chosen({}, "model"):
            return []
        if name not in names("model"):
            raise ConfigError(f"{self} is a run of model={name}, which no module imported here registers: "
                              f"run from the folder whose pyproject.toml declares it ([tool.theseus] imports), or "
                              f"set model=NAME")
        return [f"model={name}"]

    def init_from_values(self, cfg: DictConfig) -> dict[str, Any]:
        """Its architecture and tokenizer, wherever ``cfg`` leaves them at their defaults: its
        saved config's, with what its own ``trainer.init_from`` determined (a run from a Hugging
        Face folder has the folder's)."""
        if saved_base(self.path) is not None:
            raise ConfigError(f"{self} holds LoRA adapters without their base: export it merged "
                              f"(python -m theseus.export {self.given} OUT) and start from OUT")
        flat = flatten(OmegaConf.to_container(cfg, resolve=True))
        record = self._record()
        saved = flatten(OmegaConf.to_container(record, resolve=True))
        defaults = chosen_schema(cfg)
        model = chosen(record, "model")
        lacking = [key for key in saved if key.startswith("architecture.") and key not in defaults]
        if lacking and model != chosen(cfg, "model"):  # model_choice chose it for a command line; not so a config
            raise ConfigError(f"{self} is a run of model={model} ({lacking[0]}={saved[lacking[0]]}), which "
                              f"model={chosen(cfg, 'model')} cannot build: add model={model}")
        return {key: saved[key] for key in defaults
                if (key.startswith("architecture.") or key == "data.tokenizer")
                and saved.get(key) is not None and flat.get(key) == defaults[key].default}

    def architecture(self) -> tuple[str, dict[str, Any]]:
        """Its saved config's (with what its own ``trainer.init_from`` determined)."""
        record = self._record()
        saved = flatten(OmegaConf.to_container(record, resolve=True))
        return chosen(record, "model"), widths({key: value for key, value in saved.items()
                                                if key.startswith("architecture.")})

    def _record(self) -> DictConfig:
        """Its saved config, with what its own ``trainer.init_from`` determined laid over it (a
        run from a Hugging Face folder: the folder's architecture)."""
        run = self.run_dir
        if run is None:
            raise ConfigError(f"{self} has no .hydra/config.yaml beside its checkpoints: give the run "
                              f"directory a theseus run wrote")
        record = read_saved(run / SAVED_CONFIG)
        return with_values(record, init_from_values(record, init_source(record)))

    def _checkpoints(self) -> tuple[CheckpointReader, Any, str | None]:
        """Its checkpoints, the layout of the state it holds and its optimizer (None: unknown)."""
        checkpoints, run = CheckpointReader.at(self.path), self.run_dir
        optimizer = chosen(read_saved(run / SAVED_CONFIG), "optimizer") if run else None
        return checkpoints, checkpoints.saved_layout(checkpoints.requested_step), optimizer

    def check_start(self, how: StartFrom, model: nn.Module) -> None:
        """ConfigError when another optimizer's state is asked for, or a parameter has another shape."""
        _, layout, optimizer = self._checkpoints()
        problem = init_from_problem(self.given, optimizer, how.optimizer, how.init_optimizer,
                                    path_shapes(layout["params"]), path_shapes(param_shapes(model, model.seq_len)))
        if problem:
            raise ConfigError(problem)

    def check_reference(self, model: nn.Module) -> None:
        """LoRA's adapters aside: a reference is their base (orbax's own error is a traceback)."""
        _, layout, _ = self._checkpoints()
        params = {name: shape for name, shape in path_shapes(param_shapes(model, model.seq_len)).items()
                  if not lora.is_adapter(name)}
        differs = differing_param(path_shapes(layout["params"]), params)
        if differs:
            name, shape, held = differs
            raise ConfigError(f"{self}: parameter {name} is {shape} in the policy but {held}: give a reference of the "
                              f"policy's architecture and vocabulary")

    def load_params(self, arch: Mapping[str, Any], target: Mapping, seed: int = 0) -> dict:
        """Those it holds read onto their shards; ConfigError for adapters saved without their base."""
        step = step_dir(self.path)
        if saved_base(step) is not None:
            raise ConfigError(f"{self} holds LoRA adapters without their base: export it merged "
                              f"(python -m theseus.export {self.given} OUT) and give OUT")
        return read_with_fresh_adapters(step, target, saved_params(step), seed)

    def start(self, compiled: StateMaker, say: Say, how: StartFrom) -> tuple[Any, dict | None]:
        """Its params, with ``trainer.init_optimizer`` its optimizer state (the schedule's own
        count reset: the new run's schedule starts at 0), and with ``trainer.init_data`` its
        loader state."""
        checkpoints, layout, optimizer = self._checkpoints()
        target = compiled.target
        saved = path_shapes(layout["params"])
        if any(path not in saved for path in path_shapes(target.params)):  # LoRA's adapters, which it lacks: fresh
            return _with_fresh_adapters(compiled, say, checkpoints, saved, how)
        if optimizer not in (None, how.optimizer):  # another optimizer's state: read, then dropped
            replicated = NamedSharding(compiled.mesh, PartitionSpec())
            target = target.replace(opt_state=jax.tree.map(
                lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated), layout["opt_state"]))
        restored = checkpoints.restore(target, step=checkpoints.requested_step, report=say)
        if restored is None:
            raise ConfigError(f"trainer.init_from={self.given}: no readable checkpoint there")
        other, loader_state, _config, step = restored
        parts = ["weights", *(["optimizer state"] if how.init_optimizer else []),
                 *(["data position"] if how.init_data else [])]
        say(f"starting from the {', '.join(parts)} of {checkpoints.directory / str(step)}")
        state = compiled.init(other.params)
        if how.init_optimizer:
            state = state.replace(opt_state=restart_schedule(other.opt_state))
        return state, loader_state if how.init_data else None

    def config(self, overrides: Sequence[str] = ()) -> DictConfig:
        """The config its job ran (a group's choice in ``overrides``, ``task=dpo``, is the run's
        ``choices`` record). Registers the modules the config may name."""
        run = self.run_dir
        if run is None:
            raise ConfigError(f"{self} has no {SAVED_CONFIG} beside its checkpoints: give the folder a run wrote")
        require_base(run / "checkpoints")  # a LoRA run's base folder, before its config reads it
        registry.load()
        given = [f"{registry.RECORD}.{item}" if item.partition("=")[0] in registry.groups() else item
                 for item in overrides]
        return OmegaConf.merge(registry.read_saved(run / SAVED_CONFIG), OmegaConf.from_dotlist(given))

    def trained_params(self, step: int | None, arch: Mapping[str, Any], target: Any,
                       base: FrozenBase | None = None) -> tuple[Any, int | None]:
        """Its checkpoint's (``step``, else the one its path names, else the newest readable one)
        restored onto ``target``; ConfigError when there is none."""
        checkpoints = CheckpointReader(self.run_dir / "checkpoints", base=base)
        step = self.step if step is None else step
        if step is not None and step not in checkpoints.steps():
            raise ConfigError(f"{self.run_dir / 'checkpoints'} has no checkpoint of step {step}: saved steps are "
                              f"{', '.join(map(str, checkpoints.steps())) or 'none'}")
        restored = checkpoints.restore(target, step=step, report=lambda line: print(line, file=sys.stderr))
        if restored is None:
            raise ConfigError(f"{self.run_dir / 'checkpoints'} holds no readable checkpoint: train first")
        return restored[0].params, restored[3]


def _with_fresh_adapters(compiled: StateMaker, say: Say, checkpoints: CheckpointReader, saved: Mapping[str, Any],
                         how: StartFrom) -> tuple[Any, dict | None]:
    """The state at step 0 of a LoRA run from a checkpoint without (some of) its adapters: the
    params the checkpoint holds read from it (the rest left on disk), the adapters fresh
    (``lora.initial`` from ``how.seed``, as a Hugging Face base's), the state made around them."""
    step = checkpoints.chosen_step
    say(f"starting from the weights of {checkpoints.directory / str(step)} (LoRA's adapters fresh)")
    params = read_with_fresh_adapters(checkpoints.directory / str(step), compiled.target.params, saved, how.seed)
    return compiled.init(params), checkpoints.loader_state(step) if how.init_data else None


def init_from_problem(source: str, saved_optimizer: str | None, optimizer: str, init_optimizer: bool,
                      saved_params: Mapping[str, tuple[int, ...]], params: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why ``trainer.init_from=source`` cannot start this run, in one line (None: it can).

    Its optimizer state is taken only from the same optimizer; its weights only where every
    parameter this run has exists there with the same shape (the first that differs is named),
    LoRA's adapters aside (they may start fresh).
    """
    if init_optimizer and saved_optimizer is not None and saved_optimizer != optimizer:
        return (f"trainer.init_from={source}: its optimizer is {saved_optimizer}, this run's is {optimizer}: drop "
                f"trainer.init_optimizer or use optimizer={saved_optimizer}")
    fresh = [name for name in params if name not in saved_params and lora.is_adapter(name)]  # LoRA on a run without
    if fresh and init_optimizer:
        return (f"trainer.init_from={source} has no LoRA adapter {fresh[0]}, nor optimizer state for it: drop "
                f"trainer.init_optimizer")
    differs = differing_param(saved_params, {name: shape for name, shape in params.items() if name not in fresh})
    if differs:
        name, shape, held = differs
        return (f"trainer.init_from={source}: parameter {name} is {shape} in this run but {held}: "
                f"start from a run of the same architecture (or drop the architecture.* overrides)")
    return None


def differing_param(saved_params: Mapping[str, tuple[int, ...]],
                    params: Mapping[str, tuple[int, ...]]) -> tuple[str, tuple[int, ...], str] | None:
    """``(name, shape, how it is there)`` of the first of ``params`` (path -> shape) that
    ``saved_params`` (a checkpoint's) lacks or holds in another shape; None when each fits."""
    for name, shape in params.items():
        if saved_params.get(name) != shape:
            return name, shape, "does not exist there" if name not in saved_params else f"is {saved_params[name]} there"
    return None


def restart_schedule(opt_state: Any) -> Any:
    """``opt_state`` with every learning-rate schedule's step count at 0 (the moments kept)."""
    def reset(node: Any) -> Any:
        return node._replace(count=jax.numpy.zeros_like(node.count)) if isinstance(node, ScaleByScheduleState) else node

    return jax.tree.map(reset, opt_state, is_leaf=lambda node: isinstance(node, ScaleByScheduleState))
