"""SLURM through submitit (``hydra/launcher=slurm``: ``conf/hydra/launcher/slurm.yaml``, whose
launcher, ``hydra_plugins.theseus_slurm.launcher.SlurmLauncher``, calls in here; Hydra takes launchers
only from its plugin package).

Hydra's submitit launcher, with what a run that outlives its time limit needs:

- the time-limit warning (SIGUSR2, ``signal_delay_s`` before the limit) is the trainer's stop
  signal: it saves a checkpoint, then requeues the job (``theseus.training.preemption``); the
  requeued job runs the same command and resumes from that checkpoint. Before the first step
  submitit's own handler requeues at once (nothing to save);
- a time limit too short for the warning's delay, a segment's start and its save is refused
  before anything is submitted (``check_time_limit``);
- the submitting process follows each job through its requeues to its end; a job cancelled or
  timed out is a row of the sweep summary (``preempted``, resumable from its checkpoint) and one
  line, not a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from omegaconf import DictConfig

from theseus.config import ConfigError
from theseus.training.run_files import RESULT, resumable

SLURM_CHECK_S = 30  # SLURM looks for jobs to warn about every 30 s, and warns early rather than late
SEGMENT_S = 60  # what a segment needs besides training: start and compile (cached after the first), then a save


def check_time_limit(launcher: DictConfig) -> None:
    """ConfigError when a SLURM launcher's ``timeout_min`` leaves no time to train: SLURM's
    warning comes up to ``signal_delay_s + SLURM_CHECK_S`` before the limit, and a segment
    needs about ``SEGMENT_S`` to start and save."""
    if not str(launcher.get("_target_", "")).endswith("SlurmLauncher"):
        return
    limit_s, delay = 60 * int(launcher.timeout_min), int(launcher.signal_delay_s)
    needed = delay + SLURM_CHECK_S + SEGMENT_S
    if limit_s < needed:
        raise ConfigError(f"hydra.launcher.timeout_min={launcher.timeout_min} ({limit_s} s) leaves no time to train: "
                          f"SLURM warns up to {delay + SLURM_CHECK_S} s before the limit (hydra.launcher.signal_delay_s="
                          f"{delay}, checked every {SLURM_CHECK_S} s) and a segment needs about {SEGMENT_S} s to "
                          f"compile and save: give hydra.launcher.timeout_min>={-(-needed // 60)} or a smaller "
                          f"signal_delay_s")


class JobStopped(CompactHydraException):
    """A job that SLURM ended before it finished (cancelled, timed out): one line, not a traceback."""


def stopped(job: Any, run_dir: Path, overrides: Sequence[str]) -> JobReturn:
    """The JobReturn of submitit job ``job`` (in ``run_dir``), which ended without a result
    (cancelled, timed out, killed): recorded as preempted, reported in one line."""
    state = job.state
    record_preempted(run_dir, f"SLURM job {job.job_id} {state}")
    out = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
    out.return_value = JobStopped(f"job {run_dir.name} preempted: SLURM job {job.job_id} ended {state} "
                                  f"({'resumable' if resumable(run_dir) else 'no checkpoint'}; see {run_dir}/run.log)")
    return out


def record_preempted(run_dir: Path, why: str) -> None:
    """``result.json`` saying the job was preempted (kept if the job recorded its own end)."""
    path = run_dir / RESULT
    if run_dir.is_dir() and not path.is_file():
        path.write_text(json.dumps({"status": "preempted", "error": why}) + "\n")
