"""The commands a run prints: the user's, also in a sweep's job run by a launcher's worker, in a
process theseus.launch started, and from theseus.train."""

from __future__ import annotations

import sys

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import open_dict, read_write

from theseus.config.compose import compose
from theseus.training.commands import LAUNCHED, command_line, resume_command, started_by

USER = ["+experiment=gpt_tiny", "optimizer.lr=0.001"]
MORE = (("trainer.max_steps=", "hydra.run.dir=", "trainer.init_from="), ["trainer.init_from=/s/0", "hydra.run.dir=/s/0-more"])


def as_sweep_job(monkeypatch, task: list[str], hydra: list[str]) -> None:
    """This process as a launcher's worker running job 0 of a sweep into /s: Hydra's record of it."""
    cfg = compose([*task, *(o for o in hydra if not o.startswith(("hydra.sweep.dir=", "hydra.mode=")))], hydra=True)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.overrides.task = task
        cfg.hydra.overrides.hydra = hydra
    monkeypatch.setattr(sys, "argv", ["/venv/lib/submitit/core/_submit.py", "/s/.submitit/7"])
    HydraConfig.instance().set_config(cfg)


@pytest.fixture
def hydra_record():
    yield
    HydraConfig.instance().cfg = None


def test_a_slurm_sweeps_job_reruns_alone_in_its_folder_on_slurm(monkeypatch, hydra_record):
    """A one-job sweep with the sweep's launcher, less the sweep file (its lists would sweep again)."""
    as_sweep_job(monkeypatch, ["+experiment=gpt_tiny", "+sweep=lr", "optimizer.lr=0.001"],
                 ["hydra/launcher=slurm", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=4", "hydra.sweep.dir=/s",
                  "hydra.mode=MULTIRUN"])
    one_job = "python -m theseus.run -m +experiment=gpt_tiny optimizer.lr=0.001 hydra/launcher=slurm"
    assert resume_command("/s/0") == f"{one_job} hydra.sweep.dir=/s hydra.sweep.subdir=0"
    assert command_line(*MORE) == f"{one_job} trainer.init_from=/s/0 hydra.sweep.dir=/s hydra.sweep.subdir=0-more"


def test_a_local_sweeps_job_is_its_single_run_in_its_folder(monkeypatch, hydra_record):
    """Its own values (not the sweep's lists), no -m, no launcher, its own run directory."""
    as_sweep_job(monkeypatch, ["+experiment=gpt_tiny", "+sweep=lr", "optimizer.lr=0.001"],
                 ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=/s", "hydra.mode=MULTIRUN"])
    assert resume_command("/s/0") == "python -m theseus.run +experiment=gpt_tiny optimizer.lr=0.001 hydra.run.dir=/s/0"
    assert command_line(*MORE) == ("python -m theseus.run +experiment=gpt_tiny optimizer.lr=0.001 "
                                   "trainer.init_from=/s/0 hydra.run.dir=/s/0-more")


def test_a_single_runs_commands_are_its_command_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["theseus/run.py", *USER, "trainer.resume=auto", "data.path=my corpus.txt"])
    assert resume_command("outputs/x") == ("python -m theseus.run +experiment=gpt_tiny optimizer.lr=0.001 "
                                           "'data.path=my corpus.txt' trainer.resume=last")


def test_a_launched_processes_commands_are_the_launch_command(monkeypatch):
    """Without the coordinator address and process numbers that the launch gave it."""
    monkeypatch.setenv(LAUNCHED, "--processes 2 --devices-per-process 4")
    monkeypatch.setattr(sys, "argv", ["theseus/run.py", *USER, "hydra.run.dir=outputs/d/t", "hydra.output_subdir=null",
                                      "distributed.coordinator=127.0.0.1:5555", "distributed.num_processes=2",
                                      "distributed.process_id=1"])
    launch = "python -m theseus.launch --processes 2 --devices-per-process 4 -- +experiment=gpt_tiny optimizer.lr=0.001"
    assert resume_command("outputs/d/t") == f"{launch} hydra.run.dir=outputs/d/t"
    assert command_line(("hydra.run.dir=",), ["hydra.run.dir=outputs/d/t"]) == f"{launch} hydra.run.dir=outputs/d/t"


def test_theseus_trains_commands_are_its_configs(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["notebook.py", "--flag"])
    with started_by(["model=scaled_gpt", "hydra.run.dir=outputs/nb"]):
        assert resume_command("outputs/nb") == "python -m theseus.run model=scaled_gpt hydra.run.dir=outputs/nb"
    assert resume_command("outputs/nb") == "python -m theseus.run --flag trainer.resume=last"
