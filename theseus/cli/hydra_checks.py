"""Hydra's own settings for a command (``hydra/launcher=...``, ``hydra.launcher.*``,
``hydra.sweeper.*``), checked before any job runs or is submitted.

Hydra types them; their ranges it leaves to the launcher, which finds a bad one only once the
jobs are on their way (joblib's ``n_jobs=0`` as a traceback, a SLURM job of zero nodes as
sbatch's refusal, a negative warning delay not at all). Each is refused here in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from theseus.cli.slurm import check_time_limit
from theseus.config import ConfigError

# hydra.launcher counts of the submitit launchers (SLURM's and local processes'): the least each
# takes, and an example
SUBMITIT_COUNTS = {"timeout_min": (1, 60), "nodes": (1, 1), "tasks_per_node": (1, 1), "cpus_per_task": (1, 8),
                   "gpus_per_node": (0, 8), "gpus_per_task": (0, 1), "cpus_per_gpu": (1, 8), "mem_gb": (1, 64),
                   "signal_delay_s": (1, 60), "max_num_timeout": (0, 20), "array_parallelism": (1, 256)}
SWEEPER_COUNTS = {"n_trials": (1, 20), "n_jobs": (1, 2)}  # Optuna's: trials in all, and at once


def submits(launcher: Mapping[str, Any]) -> bool:
    """Whether ``hydra.launcher`` hands its jobs to submitit (SLURM, or processes of their own):
    they are assembled where they run, not in this process."""
    target = str(launcher.get("_target_", ""))
    return "submitit" in target or "theseus_slurm" in target


def check_hydra(hydra: Mapping[str, Any], multirun: bool) -> None:
    """ConfigError for a launcher that would not launch as asked (``hydra``: the composed
    ``hydra`` node; ``multirun``: ``-m`` given): a submitit launcher without ``-m`` (Hydra would
    train the one job here), a count out of its range, a SLURM time limit with no time to train;
    an Optuna sweeper with no trial."""
    launcher, name = hydra.launcher, hydra.runtime.choices.get("hydra/launcher")
    if submits(launcher) and not multirun:
        raise ConfigError(f"hydra/launcher={name} launches the jobs of a sweep (-m); without -m this one job would "
                          f"train here, on this machine: add -m (a sweep of one job), or drop hydra/launcher={name}")
    if str(launcher.get("_target_", "")).endswith("JoblibLauncher") and launcher.get("n_jobs") == 0:
        raise ConfigError("hydra.launcher.n_jobs=0 runs no job: give the jobs to run at once (-1: one per CPU core, "
                          "as joblib counts), e.g. hydra.launcher.n_jobs=2")
    if submits(launcher):
        _check_counts("hydra.launcher", launcher, SUBMITIT_COUNTS)
    if "optuna" in str(hydra.sweeper.get("_target_", "")).lower():
        _check_counts("hydra.sweeper", hydra.sweeper, SWEEPER_COUNTS)
    if multirun:
        check_time_limit(launcher)


def _check_counts(node: str, settings: Mapping[str, Any], counts: Mapping[str, tuple[int, int]]) -> None:
    for key, (least, example) in counts.items():
        value = settings.get(key)
        if value is not None and value < least:
            raise ConfigError(f"{node}.{key}={value} must be {'positive' if least else '0 or more'}: e.g. "
                              f"{node}.{key}={example}")
