"""Parallel sweep jobs on one accelerator host: each job process gets GPUs of its own.

``hydra/launcher=joblib hydra.launcher.n_jobs=N`` runs N jobs at once on one machine, each in a
worker process that would otherwise see, and preallocate most of the memory of, every GPU.
``claim_devices`` (called by a job before JAX starts its backend) gives the worker one of N
slots, held by a file lock for the worker's life, and restricts it to that slot's share of
the GPUs through ``CUDA_VISIBLE_DEVICES``; the claim is recorded beside it, in the process's
environment (``THESEUS_DEVICE_SLOT``). More parallel jobs than GPUs is refused in one line. On a
host without GPUs the slot is a share of the CPU cores instead (the process's CPU affinity), so
that the jobs' JAX devices and thread pools, sized from the cores a process may use, do not
oversubscribe them. Other launchers and one job at a time are left alone.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from theseus.base.platforms import visible_gpus
from theseus.config import ConfigError

LOCKS = ".devices"  # under the sweep folder: slot-K.lock, held by the worker that has slot K
SLOT = "THESEUS_DEVICE_SLOT"  # the environment variable of a process that holds a slot: K


def parallel_jobs(launcher: Mapping[str, Any], cpus: int | None = None) -> int:
    """How many jobs ``hydra.launcher`` runs at once on this host: joblib's ``n_jobs`` (negative
    counts back from the CPU count, as joblib does), 1 for any other launcher."""
    if not str(launcher.get("_target_", "")).endswith("JoblibLauncher"):
        return 1
    n = launcher.get("n_jobs") or 1
    return n if n > 0 else max((cpus or os.cpu_count() or 1) + 1 + n, 1)


def check_enough(n_jobs: int, gpus: list[str]) -> None:
    """ConfigError, naming hydra.launcher.n_jobs, when there are fewer GPUs than parallel jobs."""
    if n_jobs > len(gpus):
        raise ConfigError(
            f"hydra.launcher.n_jobs={n_jobs} runs {n_jobs} jobs at once, but this host has {len(gpus)} GPU(s) and "
            f"each job needs its own: set hydra.launcher.n_jobs to at most {len(gpus)} "
            f"(1: jobs in turn, each on every GPU)"
        )


def share(slot: int, n_jobs: int, gpus: list[str]) -> list[str]:
    """The GPUs of parallel job slot ``slot`` of ``n_jobs``: ``len(gpus) // n_jobs`` of them,
    disjoint from every other slot's."""
    check_enough(n_jobs, gpus)
    per = len(gpus) // n_jobs
    return gpus[slot * per:(slot + 1) * per]


def claim_slot(folder: Path, n_jobs: int) -> tuple[int, int]:
    """A free slot in ``0..n_jobs-1`` and the descriptor of its locked file: the slot is this
    process's until the descriptor is closed, which a claim never does (the process's exit
    does). Several workers start at once: each takes the first lock no other holds."""
    (folder / LOCKS).mkdir(parents=True, exist_ok=True)
    for slot in range(n_jobs):
        lock = os.open(folder / LOCKS / f"slot-{slot}.lock", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            continue
        return slot, lock
    raise RuntimeError(f"all {n_jobs} device slots under {folder / LOCKS} are held: more workers than n_jobs")


def claim_devices(hydra_config: Any, environ: MutableMapping[str, str] = os.environ) -> list[str] | None:
    """Restrict this job's process to its slot's GPUs when several jobs run at once on this host;
    returns them (None: nothing to do). Once per process: a reused worker keeps its slot, and
    must, as its JAX backend has started on those GPUs."""
    n_jobs = parallel_jobs(hydra_config.launcher)
    if n_jobs == 1:
        return None
    if SLOT in environ:
        return visible_gpus(environ) or None  # its slot was claimed (and applied) by an earlier job
    gpus = visible_gpus(environ)
    if gpus:
        check_enough(n_jobs, gpus)  # before taking a slot
    slot, _ = claim_slot(Path(hydra_config.sweep.dir), n_jobs)  # locked until this process exits
    environ[SLOT] = str(slot)
    if not gpus:
        os.sched_setaffinity(0, core_share(slot, n_jobs, sorted(os.sched_getaffinity(0))))
        return None
    mine = share(slot, n_jobs, gpus)
    environ["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    return mine


def core_share(slot: int, n_jobs: int, cores: list[int]) -> list[int]:
    """The CPU cores of parallel job slot ``slot`` of ``n_jobs``: ``len(cores) // n_jobs`` of them
    (at least one: with more jobs than cores, slots take turns on them), disjoint where they can be."""
    per = max(len(cores) // n_jobs, 1)
    start = slot * per % len(cores)
    return cores[start:start + per]
