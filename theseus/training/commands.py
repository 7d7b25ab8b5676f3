"""The commands a run prints to go on from it (resume, continue): the user's
``python -m theseus.run`` command line, whatever process runs the job.

A single run's command is this process's (``sys.argv``). A sweep's job (``-m``) runs in a
process whose command line may be its launcher's (submitit's ``python -m submitit.core._submit
FOLDER``): its command is rebuilt from what Hydra recorded, the job's own overrides and the
sweep's Hydra overrides, as a one-job sweep into the job's own folder (``hydra.sweep.dir``,
``hydra.sweep.subdir``). So it runs where the sweep ran (with its launcher: on SLURM, as a SLURM
job) and resumes that job.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

PLACE = ("hydra.sweep.dir=", "hydra.sweep.subdir=", "hydra.mode=")  # a sweep's, not its job's


def job_arguments() -> tuple[list[str], bool]:
    """The user's arguments for this job, and whether it is a sweep's job (their first is ``-m``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return sys.argv[1:], False
    recorded = HydraConfig.get().overrides
    return ["-m", *recorded.task, *(arg for arg in recorded.hydra if not arg.startswith(PLACE))], True


def place(run_dir: Path | str) -> list[str]:
    """The overrides that make a one-job sweep run in ``run_dir`` (a sweep's ``PARENT/NAME``)."""
    run_dir = Path(run_dir)
    return [f"hydra.sweep.dir={run_dir.parent}", f"hydra.sweep.subdir={run_dir.name}"]


def command_line(drop: tuple[str, ...] = (), add: Sequence[str] = ()) -> str:
    """This job's ``python -m theseus.run`` command line, less the arguments starting with one of
    ``drop`` (and any ``trainer.resume``), plus ``add``. In a sweep's job an added
    ``hydra.run.dir=DIR`` becomes the job's place (``place(DIR)``)."""
    args, sweep = job_arguments()
    kept = [arg for arg in args if not arg.startswith((*drop, "trainer.resume="))]
    if sweep:
        add = [out for arg in add
               for out in (place(arg.partition("=")[2]) if arg.startswith("hydra.run.dir=") else [arg])]
    return shlex.join(["python", "-m", "theseus.run", *kept, *add])


def resume_command(run_dir: Path | str) -> str:
    """The command line that continues the run in ``run_dir``: the same one, given
    ``hydra.run.dir``, else with ``trainer.resume=last`` (which finds the newest run it can
    continue); a sweep's job: the job alone, in its folder."""
    args, sweep = job_arguments()
    if sweep:
        return command_line(add=[f"hydra.run.dir={run_dir}"])
    given = any(arg.startswith("hydra.run.dir=") for arg in args)
    return command_line(add=[] if given else ["trainer.resume=last"])
