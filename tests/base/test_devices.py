"""Parallel sweep jobs on one host: disjoint GPU (or CPU core) shares, slots held by file locks, refusals."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf
from support import run_python

from theseus.base.devices import SLOT, claim_devices, claim_slot, core_share, parallel_jobs, share, visible_gpus
from theseus.config import ConfigError

JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"


def test_parallel_jobs_counts_joblibs_workers():
    assert parallel_jobs({"_target_": JOBLIB, "n_jobs": 3}) == 3
    assert parallel_jobs({"_target_": JOBLIB, "n_jobs": -1}, cpus=8) == 8  # joblib: -1 is every CPU
    assert parallel_jobs({"_target_": JOBLIB, "n_jobs": -2}, cpus=8) == 7
    assert parallel_jobs({"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}) == 1


def test_visible_gpus_from_the_environment_or_the_driver(tmp_path):
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, tmp_path) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == []
    for bus in ("0000:01:00.0", "0000:41:00.0", "0000:81:00.0"):
        (tmp_path / bus).mkdir()
    assert visible_gpus({}, tmp_path) == ["0", "1", "2"]
    assert visible_gpus({}, tmp_path / "absent") == []


def test_shares_are_disjoint_and_more_jobs_than_gpus_is_refused():
    gpus = [str(i) for i in range(8)]
    assert [share(slot, 4, gpus) for slot in range(4)] == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    assert [share(slot, 3, gpus) for slot in range(3)] == [["0", "1"], ["2", "3"], ["4", "5"]]  # 2 left idle
    with pytest.raises(ConfigError, match=r"hydra.launcher.n_jobs=3 runs 3 jobs at once, but this host has 2 GPU\(s\).*"
                                          r"set hydra.launcher.n_jobs to at most 2"):
        share(0, 3, ["0", "1"])


def test_each_worker_takes_a_free_slot(tmp_path):
    first, lock0 = claim_slot(tmp_path, 2)
    second, lock1 = claim_slot(tmp_path, 2)
    assert (first, second) == (0, 1)
    with pytest.raises(RuntimeError, match="all 2 device slots"):
        claim_slot(tmp_path, 2)
    os.close(lock0)  # a worker that exits frees its slot
    slot, lock = claim_slot(tmp_path, 2)
    assert slot == 0
    os.close(lock), os.close(lock1)


def test_claim_devices_restricts_the_process_once(tmp_path):
    hydra = OmegaConf.create({"launcher": {"_target_": JOBLIB, "n_jobs": 2}, "sweep": {"dir": str(tmp_path)}})
    taken, _ = claim_slot(tmp_path, 2)  # another worker holds slot 0
    environ = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert claim_devices(hydra, environ) == ["2", "3"] and environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert environ[SLOT] == "1"
    assert claim_devices(hydra, environ) == ["2", "3"]  # the next job in this worker: the same GPUs
    assert claim_devices(hydra, {SLOT: "0", "CUDA_VISIBLE_DEVICES": "0,1"}) == ["0", "1"]  # claimed before: kept
    one_job = OmegaConf.create({"launcher": {"_target_": JOBLIB, "n_jobs": 1}, "sweep": {"dir": str(tmp_path)}})
    assert claim_devices(one_job, {"CUDA_VISIBLE_DEVICES": "0,1"}) is None


def test_core_shares_are_disjoint_and_never_empty():
    assert [core_share(slot, 2, [0, 1, 2, 3]) for slot in range(2)] == [[0, 1], [2, 3]]
    assert [core_share(slot, 3, [4, 5, 6, 7]) for slot in range(3)] == [[4], [5], [6]]  # one core left idle
    assert [core_share(slot, 3, [0, 1]) for slot in range(3)] == [[0], [1], [0]]  # more jobs than cores: turns


@pytest.mark.slow
def test_a_parallel_job_on_a_cpu_host_keeps_to_its_share_of_the_cores(tmp_path):
    """The process's CPU affinity (hence its automatic JAX device count) is its slot's cores."""
    script = (f"import os; from omegaconf import OmegaConf; from theseus.base.devices import claim_devices\n"
              f"h = OmegaConf.create({{'launcher': {{'_target_': '{JOBLIB}', 'n_jobs': 2}}, 'sweep': {{'dir': '{tmp_path}'}}}})\n"
              f"os.sched_setaffinity(0, [0, 1]); print(claim_devices(h), sorted(os.sched_getaffinity(0)), os.environ['{SLOT}'])\n"
              f"print(claim_devices(h), sorted(os.sched_getaffinity(0)))  # the next job in this worker: the same cores")
    taken, _ = claim_slot(tmp_path, 2)  # another worker holds slot 0
    proc = run_python("-c", script, env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["None [1] 1", "None [1]"]


def test_a_sweep_with_more_parallel_jobs_than_gpus_is_refused_before_it_starts(tmp_path):
    proc = run_python("-m", "theseus.run", "-m", "+experiment=gpt_tiny", "optimizer.lr=1e-3,2e-3",
                      "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "logger.mode=disabled",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}", env={"CUDA_VISIBLE_DEVICES": "0"}, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "theseus: error: hydra.launcher.n_jobs=2 runs 2 jobs at once, but this host has 1 GPU(s) and each job needs "
        "its own: set hydra.launcher.n_jobs to at most 1 (1: jobs in turn, each on every GPU)")
    assert not (tmp_path / "sweep").exists()
