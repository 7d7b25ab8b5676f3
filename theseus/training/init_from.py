"""``trainer.init_from`` a theseus checkpoint (a ModelSource of kind ``run``): a new run that
starts from another's weights (with ``trainer.init_optimizer`` its optimizer state, with
``trainer.init_data`` its data position), at step 0. A Hugging Face folder or GGUF file is
``theseus.interop``'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import NamedSharding, PartitionSpec
from omegaconf import DictConfig, OmegaConf
from optax import ScaleByScheduleState

from theseus.config import ConfigError
from theseus.config.registry import chosen, read_saved
from theseus.model import lora
from theseus.model.source import SAVED_CONFIG, ModelSource
from theseus.training.checkpoint import Checkpointer, path_shapes, read_with_fresh_adapters
from theseus.training.compiled import Compiled
from theseus.training.config import TrainerConfig
from theseus.training.resume import unsafe_changes
from theseus.training.settings import Settings
from theseus.training.state import TrainState, param_shapes

Say = Callable[[str], None]


def _checkpoints(source: ModelSource) -> tuple[Checkpointer, Any, str | None]:
    """The checkpoints of a theseus run's ``source``, the layout of the state it holds and its
    optimizer (None: unknown)."""
    checkpoints, run = Checkpointer.at(source.path), source.run_dir
    optimizer = chosen(read_saved(run / ".hydra" / "config.yaml"), "optimizer") if run else None
    return checkpoints, checkpoints.saved_layout(checkpoints.requested_step), optimizer


def check_asked(trainer: TrainerConfig, source: ModelSource | None, cfg: DictConfig) -> None:
    """ConfigError when ``trainer.init_optimizer`` or ``init_data`` asks ``source`` for what it
    lacks: a Hugging Face folder or GGUF file holds weights alone; and a data position is one in
    the run's own data: ``init_data`` with ``data.*`` changed (those a resume may not change) is
    refused, ``cfg`` being this run's config."""
    for key, asked in (("init_optimizer", trainer.init_optimizer), ("init_data", trainer.init_data)):
        if asked and source is not None and source.kind != "run":
            raise ConfigError(f"trainer.{key}=true: {source} holds weights alone (optimizer state and data "
                              f"positions are a theseus checkpoint's): drop trainer.{key}")
    if trainer.init_data and source is not None and source.run_dir is not None:
        saved = OmegaConf.to_container(read_saved(source.run_dir / SAVED_CONFIG), resolve=True)
        changes = [change for change in unsafe_changes(saved, OmegaConf.to_container(cfg, resolve=True))
                   if change[0].startswith("data.")]
        if changes:
            diff = ", ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changes)
            raise ConfigError(f"trainer.init_data=true reads on where {source} stopped in its data, but this run's "
                              f"data differs ({diff}): a position in other data means nothing; give the run's "
                              f"data.* or drop trainer.init_data")


def check(settings: Settings, model: nn.Module, source: ModelSource) -> None:
    """ConfigError when the theseus checkpoint ``source`` (``trainer.init_from``) cannot start
    this run: another optimizer's state asked for, a parameter of another shape (before compiling)."""
    if source.kind != "run":
        return
    s = settings.trainer
    _, layout, optimizer = _checkpoints(source)
    problem = init_from_problem(s.init_from, optimizer, settings.optimizer.name, s.init_optimizer,
                                path_shapes(layout["params"]), path_shapes(param_shapes(model, model.seq_len)))
    if problem:
        raise ConfigError(problem)


def start(compiled: Compiled, say: Say, settings: Settings, source: ModelSource) -> tuple[TrainState, dict | None]:
    """The state at step 0 from the checkpoint ``trainer.init_from`` names: its params, with
    ``trainer.init_optimizer`` its optimizer state (the schedule's own count reset: the new
    run's schedule starts at 0), and with ``trainer.init_data`` its loader state."""
    s = settings.trainer
    checkpoints, layout, optimizer = _checkpoints(source)
    target = compiled.target
    saved = path_shapes(layout["params"])
    if any(path not in saved for path in path_shapes(target.params)):  # LoRA's adapters, which it lacks: fresh
        return _with_fresh_adapters(compiled, say, checkpoints, saved, s.init_data, s.seed)
    if optimizer not in (None, settings.optimizer.name):  # another optimizer's state: read, then dropped
        replicated = NamedSharding(compiled.mesh, PartitionSpec())
        target = target.replace(opt_state=jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated), layout["opt_state"]))
    restored = checkpoints.restore(target, step=checkpoints.requested_step, report=say)
    if restored is None:
        raise ConfigError(f"trainer.init_from={s.init_from}: no readable checkpoint there")
    other, loader_state, _config, step = restored
    parts = ["weights", *(["optimizer state"] if s.init_optimizer else []),
             *(["data position"] if s.init_data else [])]
    say(f"starting from the {', '.join(parts)} of {checkpoints.directory / str(step)}")
    state = compiled.init(other.params)
    if s.init_optimizer:
        state = state.replace(opt_state=restart_schedule(other.opt_state))
    return state, loader_state if s.init_data else None


def _with_fresh_adapters(compiled: Compiled, say: Say, checkpoints: Checkpointer, saved: Mapping[str, Any],
                         init_data: bool, seed: int) -> tuple[TrainState, dict | None]:
    """The state at step 0 of a LoRA run from a checkpoint without (some of) its adapters: the
    params the checkpoint holds read from it (the rest left on disk), the adapters fresh
    (``lora.initial`` from ``seed``, as a Hugging Face base's), the state made around them."""
    step = checkpoints.chosen_step
    say(f"starting from the weights of {checkpoints.directory / str(step)} (LoRA's adapters fresh)")
    params = read_with_fresh_adapters(checkpoints.directory / str(step), compiled.target.params, saved, seed)
    return compiled.init(params), checkpoints.loader_state(step) if init_data else None


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


def check_reference(model: nn.Module, source: ModelSource) -> None:
    """ConfigError when the theseus checkpoint ``source`` (a task's reference: ``dpo.reference``)
    holds a parameter of ``model`` in another shape, or not at all (LoRA's adapters aside: a
    reference is their base), before its weights are read (orbax's own error is a traceback)."""
    if source.kind != "run":
        return
    _, layout, _ = _checkpoints(source)
    params = {name: shape for name, shape in path_shapes(param_shapes(model, model.seq_len)).items()
              if not lora.is_adapter(name)}
    differs = differing_param(path_shapes(layout["params"]), params)
    if differs:
        name, shape, held = differs
        raise ConfigError(f"{source}: parameter {name} is {shape} in the policy but {held}: give a reference of the "
                          f"policy's architecture and vocabulary")


def restart_schedule(opt_state: Any) -> Any:
    """``opt_state`` with every learning-rate schedule's step count at 0 (the moments kept)."""
    def reset(node: Any) -> Any:
        return node._replace(count=jax.numpy.zeros_like(node.count)) if isinstance(node, ScaleByScheduleState) else node

    return jax.tree.map(reset, opt_state, is_leaf=lambda node: isinstance(node, ScaleByScheduleState))
