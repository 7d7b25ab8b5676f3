"""Checkpoints written with Orbax: asynchronous, sharded, last-k plus best, resumable; read by
``theseus.sources.checkpoint_reader.CheckpointReader``, which the writer extends.

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
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from theseus.sources.checkpoint_reader import CheckpointReader
from theseus.sources.frozen_base import FrozenBase, trainable_part


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


class Checkpointer(CheckpointReader):
    """Saves and restores a run's checkpoints under ``directory`` (one folder per step): the
    newest ``keep`` and the best by validation loss are kept."""

    def __init__(self, directory: Path, keep: int = 1, requested_step: int | None = None,
                 base: FrozenBase | None = None):
        self.keep = keep
        _replicas_written_whole_in_one_process()
        super().__init__(directory, requested_step, base)

    def options(self) -> ocp.CheckpointManagerOptions:
        """Orbax's options: written in the background, the newest ``keep`` and the best kept."""
        best = policies.BestN(get_metric_fn=lambda m: -m["val_loss"], n=1, keep_checkpoints_without_metrics=False)
        return ocp.CheckpointManagerOptions(
            preservation_policy=policies.AnyPreservationPolicy([policies.LatestN(n=max(self.keep, 1)), best]),
            enable_async_checkpointing=True,
            create=False,  # made by the first save: reading a run without checkpoints creates nothing in it
        )

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

    def wait(self) -> None:
        """Block until every background write is on disk."""
        self.manager.wait_until_finished()
