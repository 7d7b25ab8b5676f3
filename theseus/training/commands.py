"""The commands a run prints to go on from it (resume, continue): the command line that runs
this job again, whatever process runs it.

- A single run's command is this process's (``sys.argv``).
- A process that ``theseus.launch`` started (one of several "hosts") prints the launch command,
  without the coordinator address and process numbers that launch gave it (``LAUNCHED``).
- ``theseus.train(...)`` from Python prints the ``python -m theseus.run`` command of its config
  (``started_by``), its run directory given.
- A sweep's job (``-m``) runs in a process whose command line may be its launcher's
  (submitit's ``python -m submitit.core._submit FOLDER``): its command is rebuilt from what Hydra
  recorded, the job's own overrides (its values, not the sweep's lists), as a single run in the
  job's own folder; on a remote launcher (SLURM) as a one-job sweep into that folder
  (``hydra.sweep.dir``, ``hydra.sweep.subdir``) with the sweep's launcher, so that it runs on
  SLURM again; a sweep file (``+sweep=NAME``) and sweeper settings are left out, as they would
  sweep again.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

LAUNCHED = "THESEUS_LAUNCH"  # environment: the theseus.launch options of the launch that started this process
LAUNCH_GIVES = ("distributed.coordinator=", "distributed.num_processes=", "distributed.process_id=",
                "hydra.output_subdir=")  # what theseus.launch adds to each process's command line
PLACE = ("hydra.sweep.dir=", "hydra.sweep.subdir=", "hydra.mode=", "hydra.run.dir=")  # a sweep's, not its job's
SWEEPER = ("hydra/sweeper", "hydra.sweeper.")  # what chooses a sweep's jobs (Optuna's trials): one job is given
LAUNCHER = ("hydra/launcher=", "hydra.launcher.")  # where a sweep's jobs run: kept for a remote one's
SWEEP_FILE = "sweep="  # +sweep=NAME: its lists would sweep again
RUN = ("python", "-m", "theseus.run")

_STARTED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("theseus_started_by", default=None)


@contextlib.contextmanager
def started_by(arguments: Sequence[str]) -> Iterator[None]:
    """Within: this job's command line is ``python -m theseus.run ARGUMENTS`` (``theseus.train``'s)."""
    token = _STARTED.set(list(arguments))
    try:
        yield
    finally:
        _STARTED.reset(token)


@dataclasses.dataclass(frozen=True)
class Command:
    """How this job was started: ``program`` (``python -m theseus.run``, or ``theseus.launch``
    with its options), its ``arguments``, and whether it is a sweep's job (``remote``: of a sweep
    on a remote launcher, its arguments then a one-job sweep starting with ``-m``)."""

    program: tuple[str, ...]
    arguments: tuple[str, ...]
    sweep_job: bool = False
    remote: bool = False


def this_command() -> Command:
    """The command that runs this job (see the module's docstring)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if _STARTED.get() is not None:
        return Command(RUN, tuple(_STARTED.get()))
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        hydra = HydraConfig.get()
        task = [arg for arg in hydra.overrides.task if not arg.lstrip("+").startswith(SWEEP_FILE)]
        own = [arg for arg in hydra.overrides.hydra if not arg.startswith((*PLACE, *SWEEPER))]
        if runs_elsewhere(hydra.launcher):
            return Command(RUN, ("-m", *task, *own), sweep_job=True, remote=True)
        return Command(RUN, (*task, *(arg for arg in own if not arg.startswith(LAUNCHER))), sweep_job=True)
    args = sys.argv[1:]
    if os.environ.get(LAUNCHED) is not None:
        program = ("python", "-m", "theseus.launch", *shlex.split(os.environ[LAUNCHED]), "--")
        return Command(program, tuple(arg for arg in args if not arg.startswith(LAUNCH_GIVES)))
    return Command(RUN, tuple(args))


def runs_elsewhere(launcher) -> bool:
    """Whether a sweep's ``hydra.launcher`` runs its jobs on other machines, each writing its
    output to files of its own: submitit's (SLURM)."""
    return "submitit_folder" in launcher


def place(run_dir: Path | str) -> list[str]:
    """The overrides that make a one-job sweep run in ``run_dir`` (a sweep's ``PARENT/NAME``)."""
    run_dir = Path(run_dir)
    return [f"hydra.sweep.dir={run_dir.parent}", f"hydra.sweep.subdir={run_dir.name}"]


def command_line(drop: tuple[str, ...] = (), add: Sequence[str] = ()) -> str:
    """This job's command line, less the arguments starting with one of ``drop`` (and any
    ``trainer.resume``), plus ``add``. In a remote sweep's job an added ``hydra.run.dir=DIR``
    becomes the job's place (``place(DIR)``)."""
    command = this_command()
    kept = [arg for arg in command.arguments if not arg.startswith((*drop, "trainer.resume="))]
    if command.remote:
        add = [out for arg in add
               for out in (place(arg.partition("=")[2]) if arg.startswith("hydra.run.dir=") else [arg])]
    return shlex.join([*command.program, *kept, *add])


def resume_command(run_dir: Path | str) -> str:
    """The command line that continues the run in ``run_dir``: the same one when it gives
    ``hydra.run.dir``; a sweep's job: the job alone, in its folder; else the same one with
    ``trainer.resume=last`` (which finds the newest run this command started)."""
    command = this_command()
    if any(arg.startswith("hydra.run.dir=") for arg in command.arguments):
        return command_line()
    if command.sweep_job:
        return command_line(add=[f"hydra.run.dir={run_dir}"])
    return command_line(add=["trainer.resume=last"])
