"""Checkpoints with Orbax: asynchronous, sharded, last-k plus best, resumable.

A checkpoint holds the train state (params, optimizer state, step; saved and restored
sharded, onto any mesh), the data loader's position and the run's config. Orbax writes each
step to a temporary folder and renames it when complete, so a crash mid-write never leaves a
checkpoint that looks whole; one that is damaged anyway is reported and the one before used.

A LoRA run started from weights (``trainer.init_from``: a ``FrozenBase``) saves its trainable
params alone (the adapters) with their optimizer state, and a record of its base (``base``:
the folder and a fingerprint of its weights); restoring loads the base from that folder,
checked against the fingerprint, and lays the adapters over it.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Container, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers as policies

from theseus.config import ConfigError
from theseus.model import lora
from theseus.model.source import run_of
from theseus.training.frozen_base import FrozenBase, require_base_weights, trainable_part, with_part
from theseus.training.stacked_inputs import as_saved, as_today, holds_stacked


@functools.cache
def _replicas_written_whole_in_one_process() -> None:
    """A replicated array saved whole by one of its replicas when they are all in this process:
    orbax's replica-parallel saving slices each array across its replicas, a program compiled per
    shape and replica (gpt_tiny on two CPU devices: 18, 0.7 s at a command's first save), and gains
    only where the replicas are on several hosts. Registered once (orbax's registry is global and
    logs each override)."""
    if jax.process_count() > 1:
        return
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False),
                                                override=True)
    finally:
        absl.setLevel(level)


SWITCH_WHILE_SAVING = 2e-4  # seconds a thread holds the GIL before handing it over, while a save is written
_SWITCH = sys.getswitchinterval()  # Python's own (5 ms)


def _yielding_while_saving(manager: ocp.CheckpointManager) -> None:
    """While ``manager`` writes in the background, threads hand the GIL over every 0.2 ms rather
    than Python's 5 ms. Orbax's writing threads run Python in short bursts (per array: paths,
    metadata, futures; ~70 ms a save of gpt_small's state on a CPU, by py-spy's GIL samples); at
    5 ms, each time the step loop lets the GIL go (dispatching a step, taking a batch) it may wait
    5 ms to have it back, which a step of a few ms cannot hide. A watcher thread, polling without
    waiting on the save (its errors stay the loop's to see), puts Python's interval back once
    nothing is in flight."""
    sys.setswitchinterval(SWITCH_WHILE_SAVING)

    def restore() -> None:
        while manager.is_saving_in_progress():
            time.sleep(0.01)
        sys.setswitchinterval(_SWITCH)

    threading.Thread(target=restore, daemon=True, name="theseus-checkpoint-switch").start()


class Checkpointer:
    """Saves and restores a run's checkpoints under ``directory`` (one folder per step)."""

    def __init__(self, directory: Path, keep: int = 1, requested_step: int | None = None,
                 base: FrozenBase | None = None):
        best = policies.BestN(get_metric_fn=lambda m: -m["val_loss"], n=1, keep_checkpoints_without_metrics=False)
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policies.AnyPreservationPolicy([policies.LatestN(n=max(keep, 1)), best]),
            enable_async_checkpointing=True,
            create=False,  # made by the first save: reading a run without checkpoints creates nothing in it
        )
        self.directory = Path(directory).absolute()
        self.requested_step = requested_step  # restore this step rather than the newest
        self.base = base  # a LoRA run's frozen base: saved as a record, not as arrays
        _replicas_written_whole_in_one_process()
        handlers = {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
                    "config": ocp.JsonCheckpointHandler(), "base": ocp.JsonCheckpointHandler()}
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

    @classmethod
    def at(cls, path: Path, base: FrozenBase | None = None) -> Checkpointer:
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

    def save(self, step: int, state: Any, loader_state: dict, config: dict, val_loss: float | None = None) -> None:
        """Start writing checkpoint ``step`` in the background (training goes on); with a frozen
        base, its trainable params alone and the base's record.

        In one process the state is first copied to host memory, whole, before this returns: the
        writing that follows touches no device. Left to Orbax, the copies run beside the next
        steps, and on a TPU each of those waits on them (gpt_small on a v5e: 3.2 ms steps ran at
        30-90 ms for ~40 steps after every save); the copy alone, in the hook's time, took 0.17 s
        for gpt_small's 125 MiB state on that host.
        Several processes keep Orbax's own copies: each writes its shards of the global arrays.
        """
        items = {"data": ocp.args.JsonSave(loader_state), "config": ocp.args.JsonSave(config)}
        if self.base is not None:
            state = state.replace(params=trainable_part(state.params))
            items["base"] = ocp.args.JsonSave(self.base.record)
        if jax.process_count() == 1:
            state = jax.device_get(state)
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), **items)
        metrics = {"val_loss": val_loss} if val_loss is not None else None
        self.directory.mkdir(parents=True, exist_ok=True)
        self.manager.save(step, args=args, metrics=metrics, force=True)
        _yielding_while_saving(self.manager)

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
        return _base_record(self.directory / str(step))

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

    def wait(self) -> None:
        """Block until every background write is on disk."""
        self.manager.wait_until_finished()

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
    checkpoints = Checkpointer(step_dir.parent)
    try:
        return path_shapes(checkpoints.saved_layout(int(step_dir.name))["params"])
    finally:
        checkpoints.close()


def step_dir(path: Path) -> Path | None:
    """The step folder a checkpoint path points at (as ``Checkpointer.at``: a step's folder, else
    the newest step of a run directory or its checkpoints/); None when there is none. Found by
    listing folders: no JAX work, so it may run before a run sets its devices."""
    path = Path(path).expanduser()
    if path.name.isdigit() and path.is_dir():
        return path
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    steps = [int(child.name) for child in folder.iterdir() if child.name.isdigit()] if folder.is_dir() else []
    return folder / str(max(steps)) if steps else None


BASE_RECORD = Path("base") / "metadata"  # the file Orbax's JSON handler writes the ``base`` item to


def _base_record(step_dir: Path) -> dict | None:
    file = step_dir / BASE_RECORD
    return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None


def saved_base(path: Path) -> dict | None:
    """The base record of the checkpoint ``path`` points at (``step_dir``); None when it holds
    every parameter, or there is none. Read from its file: no JAX work."""
    found = step_dir(path)
    return _base_record(found) if found else None


def require_base(directory: Path) -> None:
    """ConfigError when the newest checkpoint in ``directory`` holds LoRA adapters whose base
    folder is not there, or holds other weights: said before anything reads the folder
    (``trainer.init_from``), or a resumed run writes into its directory."""
    found = step_dir(directory)
    record = _base_record(found) if found else None
    if record is not None:
        require_base_weights(record, found)
