"""The commands a run prints: the user's, also in a sweep's job run by a launcher's worker."""

from __future__ import annotations

import sys

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import open_dict, read_write

from theseus.config.compose import compose
from theseus.training.commands import command_line, resume_command

USER = ["+experiment=gpt_tiny", "optimizer.lr=0.001"]


@pytest.fixture
def sweep_job(monkeypatch):
    """This process as submitit's worker running job 0 of ``-m ... hydra/launcher=slurm hydra.sweep.dir=/s``."""
    cfg = compose(USER, hydra=True)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.overrides.task = USER
        cfg.hydra.overrides.hydra = ["hydra/launcher=slurm", "hydra.sweep.dir=/s", "hydra.mode=MULTIRUN"]
    monkeypatch.setattr(sys, "argv", ["/venv/lib/submitit/core/_submit.py", "/s/.submitit/7"])
    HydraConfig.instance().set_config(cfg)
    yield
    HydraConfig.instance().cfg = None


def test_a_sweep_jobs_commands_rerun_it_alone_in_its_folder_with_the_sweeps_launcher(sweep_job):
    one_job = "python -m theseus.run -m +experiment=gpt_tiny optimizer.lr=0.001 hydra/launcher=slurm"
    assert resume_command("/s/0") == f"{one_job} hydra.sweep.dir=/s hydra.sweep.subdir=0"
    assert (command_line(("trainer.max_steps=", "hydra.run.dir=", "trainer.init_from="),
                         ["trainer.init_from=/s/0", "hydra.run.dir=/s/0-more"])
            == f"{one_job} trainer.init_from=/s/0 hydra.sweep.dir=/s hydra.sweep.subdir=0-more")


def test_a_single_runs_commands_are_its_command_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["theseus/run.py", *USER, "trainer.resume=auto", "data.path=my corpus.txt"])
    assert resume_command("outputs/x") == ("python -m theseus.run +experiment=gpt_tiny optimizer.lr=0.001 "
                                           "'data.path=my corpus.txt' trainer.resume=last")
