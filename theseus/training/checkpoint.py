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
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from theseus.sources.checkpoint_reader import CheckpointReader
from theseus.sources.frozen_base import FrozenBase, trainable_part
from theseus.training.checkpoint_writer import WriterProcess, writes_in_own_process


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


class Checkpointer(CheckpointReader):
    """Saves and restores a run's checkpoints under ``directory`` (one folder per step): the
    newest ``keep`` and the best by validation loss are kept."""

    def __init__(self, directory: Path, keep: int = 1, requested_step: int | None = None,
                 base: FrozenBase | None = None, writer: str = "auto"):
        """``writer`` (``trainer.checkpoint_writer``): "process", saves written by a process of
        their own (``checkpoint_writer``); "threads", by Orbax's threads here; "auto", the process
        where that pays (``writes_in_own_process``)."""
        self.keep = keep
        _replicas_written_whole_in_one_process()
        super().__init__(directory, requested_step, base)
        own = writes_in_own_process() if writer == "auto" else writer == "process"
        self.writer = WriterProcess(self.directory, keep) if own else None

    def options(self) -> ocp.CheckpointManagerOptions:
        """Orbax's options: written in the background, the newest ``keep`` and the best kept."""
        best = policies.BestN(get_metric_fn=lambda m: -m["val_loss"], n=1, keep_checkpoints_without_metrics=False)
        return ocp.CheckpointManagerOptions(
            preservation_policy=policies.AnyPreservationPolicy([policies.LatestN(n=max(self.keep, 1)), best]),
            enable_async_checkpointing=True,
            create=False,  # made by the first save: reading a run without checkpoints creates nothing in it
        )

    def save(self, step: int, state: Any, loader_state: dict, config: dict, val_loss: float | None = None) -> None:
        """Start writing checkpoint ``step`` (training goes on); with a frozen base, its trainable
        params alone and the base's record.

        The state is copied to host memory, whole, before this returns (the writer process's
        shared memory, or this process's, where one process writes): the writing that follows
        touches no device. Left to Orbax, the copies of the state's own buffers run beside the
        next steps, and on a TPU each of those waits on them (gpt_small on a v5e: 3.2 ms steps
        ran at 30-90 ms for ~40 steps after every save). Several processes keep Orbax's own
        copies: each writes its shards of the global arrays.
        """
        items = {"data": loader_state, "config": config}
        if self.base is not None:
            items["base"] = self.base.record
        state = self._saved(state)
        metrics = {"val_loss": val_loss} if val_loss is not None else None
        if self.writer is not None:
            self.writer.save(step, state, items, metrics)
        else:
            self.write(step, jax.device_get(state) if jax.process_count() == 1 else state, items, metrics)

    def prepare(self, state: Any) -> None:
        """Ready the writer process, where there is one, for saves of ``state`` before the loop's
        first step (``WriterProcess.prepare``); Orbax's threads need nothing."""
        if self.writer is not None:
            self.writer.prepare(self._saved(state))

    def _saved(self, state: Any) -> Any:
        """What a checkpoint holds of ``state``: with a frozen base, its trainable params alone."""
        return state if self.base is None else state.replace(params=trainable_part(state.params))

    def write(self, step: int, state: Any, items: dict[str, Any], metrics: dict | None) -> None:
        """Orbax's save of ``state`` and the JSON ``items``, in this process's background threads."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  **{name: ocp.args.JsonSave(item) for name, item in items.items()})
        self.directory.mkdir(parents=True, exist_ok=True)
        self.manager.save(step, args=args, metrics=metrics, force=True)

    def wait(self) -> None:
        """Block until every checkpoint saved is on disk."""
        if self.writer is not None:
            self.writer.wait()
            self.manager.reload()  # the writer's checkpoints, seen by this process's manager
        self.manager.wait_until_finished()

    def steps(self) -> list[int]:
        """The steps checkpointed, once those being written are on disk."""
        if self.writer is not None:
            self.wait()
        return super().steps()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        super().close()
