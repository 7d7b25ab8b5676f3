"""theseus's own checkpoints read with Orbax: the train state onto any mesh, the params alone, a
step's layout from its metadata; the writer (``theseus.training.checkpoint.Checkpointer``) is
this reader that also saves.

    checkpoints = CheckpointReader.at("outputs/tiny")        # a run directory, its checkpoints/ or one step
    state, loader_state, config, step = checkpoints.restore(target)
    params = read_with_fresh_adapters(step_folder, layout, saved_params(step_folder), seed)

A damaged checkpoint is reported and set aside (renamed, not deleted), and the one before
used. One holding a LoRA run's adapters without their base (``FrozenBase``) has the base
loaded from the folder its record names, checked against its fingerprint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util
from jax.experimental import multihost_utils

from theseus.config import ConfigError
from theseus.model import lora
from theseus.sources.checkpoint_folders import base_record, run_of
from theseus.sources.frozen_base import FrozenBase, trainable_part, with_part
from theseus.sources.stacked_inputs import as_saved, as_today, holds_stacked


class CheckpointReader:
    """Reads a run's checkpoints under ``directory`` (one folder per step)."""

    def __init__(self, directory: Path, requested_step: int | None = None, base: FrozenBase | None = None):
        self.directory = Path(directory).absolute()
        self.requested_step = requested_step  # restore this step rather than the newest
        self.base = base  # a LoRA run's frozen base: saved as a record, not as arrays
        handlers = {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
                    "config": ocp.JsonCheckpointHandler(), "base": ocp.JsonCheckpointHandler()}
        self.manager = ocp.CheckpointManager(self.directory, options=self.options(), item_handlers=handlers)

    def options(self) -> ocp.CheckpointManagerOptions:
        """Orbax's options: reading creates nothing (not even the folder)."""
        return ocp.CheckpointManagerOptions(create=False)

    @classmethod
    def at(cls, path: Path, base: FrozenBase | None = None) -> CheckpointReader:
        """The checkpoints a user points at: a run directory, its checkpoints/ or one step."""
        path = Path(path)
        if (path / "checkpoints").is_dir():
            return cls(path / "checkpoints", base=base)
        if path.name.isdigit() and path.parent.is_dir():
            return cls(path.parent, requested_step=int(path.name), base=base)
        return cls(path, base=base)

    @staticmethod
    def exists(directory: Path) -> bool:
        """Whether ``directory`` holds any completed checkpoint."""
        return Path(directory).is_dir() and any(p.name.isdigit() for p in Path(directory).iterdir())

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def restore(self, abstract_state: Any, step: int | None = None,
                report: Callable[[str], None] = print) -> tuple[Any, dict, dict, int] | None:
        """The newest readable checkpoint (or ``step``): (state, loader state, config, step).

        ``abstract_state`` gives the shapes, dtypes and shardings to restore onto. A damaged
        checkpoint is reported in one line, set aside and the previous one tried; None when
        none is left. A whole checkpoint whose arrays do not fit ``abstract_state`` (another
        model) raises ConfigError: that is a mistake in the config, not damage. One holding a
        LoRA run's adapters without their base gets the base loaded (ConfigError when its
        weights are not the ones the adapters trained on).
        """
        candidates = [step] if step is not None else sorted(self.steps(), reverse=True)
        for candidate in candidates:
            try:
                saved, problem = self.manager.item_metadata(candidate)["state"], None
                record = self.base_record(candidate)
            except Exception as exc:  # noqa: BLE001 - unreadable metadata: damaged
                saved, problem = None, exc
            if not _everywhere(problem is None):
                self._damaged(candidate, problem, report)
                continue
            target = abstract_state
            if record is not None:
                self._check_base(record, candidate)
                target = abstract_state.replace(params=trainable_part(abstract_state.params))
            stacked = holds_stacked(saved)
            if stacked:  # saved before the input projections were weights of their own
                target, today = as_saved(target), target
            if _shapes(saved) != _shapes(target):
                raise ConfigError(
                    f"checkpoint {self.directory / str(candidate)} holds arrays of other shapes than this "
                    f"model's: resume with the config it was trained with, or use a new hydra.run.dir"
                )
            args = ocp.args.Composite(state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore(),
                                      config=ocp.args.JsonRestore())
            try:
                restored, problem = self.manager.restore(candidate, args=args), None
            except Exception as exc:  # noqa: BLE001 - metadata fits but the data does not read: damaged
                restored, problem = None, exc
            if not _everywhere(problem is None):
                self._damaged(candidate, problem, report)
                continue
            state = _placed(as_today(restored.state), today) if stacked else restored.state
            if record is not None:  # the adapters over their base
                base = self.base.load(Path(record["folder"]), abstract_state.params)
                state = state.replace(params=with_part(base, state.params))
            return state, dict(restored.data), dict(restored.config), candidate
        return None

    def base_record(self, step: int) -> dict | None:
        """The record of the frozen base checkpoint ``step`` was saved without (None: it holds
        every parameter)."""
        return base_record(self.directory / str(step))

    def _check_base(self, record: dict, step: int) -> None:
        """ConfigError unless this run knows the base of checkpoint ``step`` and it is unchanged."""
        where = self.directory / str(step)
        if self.base is None:
            raise ConfigError(f"checkpoint {where} holds LoRA adapters without their base ({record['folder']}): "
                              f"read it through its own run (python -m theseus.sample, evaluate or export "
                              f"{run_of(where) or where}), or export it merged and start from that folder")
        self.base.check(record, where)

    @property
    def chosen_step(self) -> int | None:
        """The step a user pointed at (``requested_step``), else the newest; None: none saved."""
        return self.requested_step if self.requested_step is not None else max(self.steps(), default=None)

    def loader_state(self, step: int) -> dict:
        """The data loader's position saved at ``step``."""
        return dict(self.manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore())).data)

    def saved_layout(self, step: int | None = None) -> Any:
        """The metadata tree (shape, dtype per array) of the train state saved at ``step``
        (None: the newest), read without loading any array; in today's layout (``stacked_inputs``)."""
        saved = self.manager.item_metadata(step if step is not None else self.manager.latest_step())["state"]
        return as_today({key: saved[key] for key in saved}) if holds_stacked(saved) else saved

    def _damaged(self, step: int, exc: Exception | None, report: Callable[[str], None]) -> None:
        kept = self._set_aside(step)
        reason = type(exc).__name__ if exc else "on another process"
        report(f"checkpoint {self.directory / str(step)} is unreadable ({reason}); "
               f"kept as {kept.name}, falling back to an earlier one")

    def _set_aside(self, step: int) -> Path:
        """Rename a damaged step out of the way (not deleted: nothing is lost), so it can be rewritten."""
        damaged = self.directory / f"damaged-{step}-{int(time.time())}"
        if jax.process_index() == 0:
            (self.directory / str(step)).rename(damaged)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"theseus: set aside checkpoint {step}")
        self.manager.reload()
        return damaged

    def close(self) -> None:
        self.manager.close()


def _everywhere(ok: bool) -> bool:
    """Whether ``ok`` holds in every process (each judges its own shards of a checkpoint)."""
    if jax.process_count() == 1:
        return ok
    return bool(multihost_utils.process_allgather(np.int32(ok)).min())


def path_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """``{"wte/embedding": (vocab, d), ...}``: the shape of each array of ``tree`` by its path."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path): tuple(leaf.shape)
            for path, leaf in leaves if hasattr(leaf, "shape")}


def _shapes(tree: Any) -> list[tuple[int, ...]]:
    """The sorted shapes of a tree's arrays: what must agree for a checkpoint to fit."""
    return sorted(tuple(leaf.shape) for leaf in jax.tree.leaves(tree) if hasattr(leaf, "shape"))


def read_params(step_dir: Path, layout: Any) -> Any:
    """The params ``layout`` names (ShapeDtypeStructs with shardings; a subset of those saved in
    the checkpoint ``step_dir``: a LoRA run's frozen base), read onto their shards; the rest of
    the checkpoint stays on disk."""
    manager = ocp.CheckpointManager(step_dir.parent, options=ocp.CheckpointManagerOptions(create=False),
                                    item_handlers={"state": ocp.PyTreeCheckpointHandler()})
    step = int(step_dir.name)
    stacked = holds_stacked(manager.item_metadata(step)["state"]["params"])
    target = as_saved(layout) if stacked else layout  # saved before the input projections were weights of their own
    places = jax.tree.map(lambda leaf: ocp.ArrayRestoreArgs(sharding=leaf.sharding, dtype=leaf.dtype), target)
    args = ocp.args.PyTreeRestore({"params": target}, restore_args={"params": places}, partial_restore=True)
    params = manager.restore(step, args=ocp.args.Composite(state=args)).state["params"]
    manager.close()
    return _placed(as_today(params), layout) if stacked else params


def read_with_fresh_adapters(step_dir: Path, layout: Mapping, held: Container[str], seed: int) -> dict:
    """The params ``layout`` names (ShapeDtypeStructs with shardings) from the checkpoint
    ``step_dir``, whose params are ``held`` (paths): those it holds read onto their shards (as
    ``read_params``), LoRA's adapters it lacks drawn fresh (``lora.initial`` from ``seed``, the
    same on every process)."""
    flat = traverse_util.flatten_dict(layout, sep="/")
    fresh = {path: jax.make_array_from_callback(leaf.shape, leaf.sharding, _part(
                 lora.initial(path, leaf.shape, leaf.dtype, seed)))
             for path, leaf in flat.items() if lora.is_adapter(path) and path not in held}
    read = read_params(step_dir, traverse_util.unflatten_dict(
        {path: leaf for path, leaf in flat.items() if path not in fresh}, sep="/"))
    return with_part(read, traverse_util.unflatten_dict(fresh, sep="/"))


def _part(host: np.ndarray) -> Callable[[Any], np.ndarray]:
    """``make_array_from_callback``'s callback: a device's slice of ``host``."""
    return lambda index: host[index]


def _placed(tree: Any, layout: Any) -> Any:
    """``tree``'s arrays laid out as ``layout``'s (the same structure) says."""
    return jax.tree.map(lambda leaf, like: jax.device_put(leaf, like.sharding), tree, layout)


def saved_params(step_dir: Path) -> dict[str, tuple[int, ...]]:
    """``{"wte/embedding": shape, ...}``: the params the checkpoint ``step_dir`` holds, read from
    its metadata (no array loaded)."""
    checkpoints = CheckpointReader(step_dir.parent)
    try:
        return path_shapes(checkpoints.saved_layout(int(step_dir.name))["params"])
    finally:
        checkpoints.close()
