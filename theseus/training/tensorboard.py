"""TensorBoard event files for a run (``logger.tensorboard=true``), beside W&B and metrics.jsonl.

Scalars go under the same sections as in W&B (``train/loss``, ``val/loss``, ``throughput/mfu``)
into ``RUN_DIR/tensorboard``; the job's command-line overrides are its HParams, so that
``tensorboard --logdir SWEEP_DIR`` shows a sweep in the HParams dashboard (each job one session,
its swept keys as columns, ``val/loss`` as the metric). Written with tensorboardX: no TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from theseus.training.run_files import parse_override

FOLDER = "tensorboard"
METRICS = ("val/loss", "train/loss")  # the HParams dashboard's metric columns (scalar tags)


def job_hparams() -> dict[str, bool | int | float | str]:
    """The current Hydra job's command-line overrides as HParams (``optimizer.lr -> 0.001``;
    a list or null as its text); empty outside a Hydra job (``theseus.train`` from Python)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    found = {}
    for override in HydraConfig.get().overrides.task:
        parsed = parse_override(override)
        if parsed is not None:
            key, value = parsed
            found[key] = value if isinstance(value, bool | int | float | str) else str(value)
    return found


class TensorBoard:
    """An event-file writer in ``run_dir/tensorboard`` that records ``hparams`` once."""

    def __init__(self, run_dir: Path, hparams: Mapping[str, bool | int | float | str]):
        from tensorboardX import SummaryWriter  # here: only a run that asks for TensorBoard imports it
        from tensorboardX.summary import hparams as hparams_summary

        self._writer = SummaryWriter(logdir=str(Path(run_dir) / FOLDER), flush_secs=10)
        self._end = None
        if hparams:
            experiment, start, self._end = hparams_summary(dict(hparams), dict.fromkeys(METRICS))
            self._writer.file_writer.add_summary(experiment)
            self._writer.file_writer.add_summary(start)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Scalars at ``step``, by their sectioned names; NaN and Inf are left out."""
        for tag, value in values.items():
            if math.isfinite(value):
                self._writer.add_scalar(tag, value, step)

    def close(self, failed: bool = False) -> None:
        """End the HParams session (a failed run's stays open: TensorBoard shows it unfinished)."""
        if self._end is not None and not failed:
            self._writer.file_writer.add_summary(self._end)
        self._writer.close()

