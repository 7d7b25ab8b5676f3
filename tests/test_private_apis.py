"""The private library APIs theseus relies on, each used in one place, checked here so that a
library upgrade that changes one fails loudly in this file rather than quietly in a run.

- ``jax._src.clusters`` (theseus/base/distributed.py): JAX's cluster detection, which
  ``jax.distributed.initialize()`` reads and no public API exposes.
- ``BasicSweeper.split_arguments`` (theseus/cli/run.py): Hydra's expansion of ``-m`` overrides
  into jobs, to check every job before any runs.
- ``JobReturn._return_value`` (theseus/cli/sweep.py): a failed job's exception; the public
  ``return_value`` re-raises it and writes to stderr.
- ``DictConfig._set_flag`` / ``_get_flag`` (theseus/config/context.py): the mark ``compose()``
  leaves on a config it has checked; copies keep it.
- ``ArgumentParser._option_string_actions`` (theseus/config/arguments.py): every option string a
  parser takes, a mutually exclusive group's too, for the did-you-mean of an unknown option.
"""

from __future__ import annotations

import argparse
import copy

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf, open_dict

from theseus.base.distributed import CLUSTERS, detected_processes
from theseus.config.context import is_checked, mark_checked

SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NTASKS": "4", "SLURM_PROCID": "1",
         "SLURM_LOCALID": "0"}


def test_jax_cluster_detection_reads_a_slurm_job(monkeypatch):
    from jax._src import clusters

    assert all(issubclass(env, clusters.ClusterEnv) for env in CLUSTERS)
    assert all(callable(env.is_env_present) and callable(env.get_process_count) for env in CLUSTERS)
    for name in SLURM:
        monkeypatch.delenv(name, raising=False)
    assert not clusters.SlurmCluster.is_env_present()
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    assert detected_processes() == 4


def test_hydra_splits_multirun_overrides_into_jobs():
    parsed = OverridesParser.create().parse_overrides(["a=1,2", "b=x", "c=3,4"])
    jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    assert jobs == [["a=1", "b=x", "c=3"], ["a=1", "b=x", "c=4"], ["a=2", "b=x", "c=3"], ["a=2", "b=x", "c=4"]]


def test_a_failed_job_return_holds_its_exception():
    error = FloatingPointError("loss is nan")
    job = JobReturn(status=JobStatus.FAILED, _return_value=error)
    assert job._return_value is error


def test_the_checked_mark_is_an_omegaconf_flag_that_copies_keep():
    cfg = OmegaConf.create({"architecture": {"n_layers": 2}, "hydra": {}})
    assert not is_checked(cfg)
    mark_checked(cfg)
    copied = cfg.copy()
    with open_dict(copied):
        del copied["hydra"]
    assert is_checked(copied) and is_checked(copy.deepcopy(cfg)) and is_checked(OmegaConf.merge(cfg, {}))
    assert not is_checked(OmegaConf.create(OmegaConf.to_container(cfg)))  # the values alone are not marked


def test_a_parser_lists_every_option_it_takes():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-new-tokens", "-n")
    parser.add_mutually_exclusive_group().add_argument("--chat")
    assert set(parser._option_string_actions) == {"-h", "--help", "--max-new-tokens", "-n", "--chat"}
