"""Start-up on a TPU host: a one-host run never asks the cloud's metadata server, and a job whose
size cannot be read is one line naming the ``distributed.*`` keys. The host's environment is a
TPU VM's as one chip's machine showed it (``TPU_WORKER_HOSTNAMES=localhost``, ``TPU_WORKER_ID``,
``TPU_SKIP_MDS_QUERY``), JAX told it runs on a TPU VM, and the metadata server unreachable (a
closed port on this machine): no chip needed."""

from __future__ import annotations

import re
import socket

import jax
import pytest
import requests
from jax._src.clusters import cloud_tpu_cluster

from theseus.base.distributed import detected_processes, initialize
from theseus.config import ConfigError

CLUSTER_VARIABLES = ("SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri", "PMIX_SERVER_URI", "TPU_PROCESS_ADDRESSES",
                     "MEGASCALE_NUM_SLICES", "MEGASCALE_COORDINATOR_ADDRESS")


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def tpu_host(monkeypatch):
    """This process as JAX sees a TPU VM of one host whose metadata server does not answer."""
    for name in CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", True)
    for name, value in {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0", "TPU_SKIP_MDS_QUERY": "true",
                        "TPU_ACCELERATOR_TYPE": "v5litepod-4", "GCE_METADATA_IP": f"127.0.0.1:{closed_port()}"}.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_jax_alone_asks_the_metadata_server_on_a_one_host_tpu_vm(tpu_host):
    """What the chip's first run met: JAX's own count needs the server (this is the environment's check)."""
    assert cloud_tpu_cluster.GkeTpuCluster.is_env_present()
    with pytest.raises(requests.exceptions.ConnectionError):
        cloud_tpu_cluster.GkeTpuCluster.get_process_count()


def test_a_one_host_tpu_vm_is_one_process_without_the_metadata_server(tpu_host):
    assert detected_processes() == 1
    initialize({"distributed": {}})  # a single process: nothing joined
    assert not jax.distributed.is_initialized()


def test_a_slice_of_four_hosts_is_counted_from_its_variables(tpu_host):
    tpu_host.setenv("TPU_WORKER_HOSTNAMES", "t1k-0,t1k-1,t1k-2,t1k-3")
    assert detected_processes() == 4


def test_a_job_whose_size_only_the_metadata_holds_is_one_line_naming_the_keys(tpu_host):
    tpu_host.setenv("MEGASCALE_COORDINATOR_ADDRESS", "t1k-0")  # multislice: the slice count is the metadata's
    message = (r"^this host looks like part of a cluster job \(GkeTpuCluster\) but its size could not be read "
               r"\(ConnectionError: .*\): for a one-host run set distributed.num_processes=1; for several hosts "
               r"set distributed.coordinator, num_processes and process_id$")
    with pytest.raises(ConfigError, match=message) as raised:
        detected_processes()
    assert "\n" not in str(raised.value)
    initialize({"distributed": {"num_processes": 1}})  # what the line says works, the metadata still unreachable
    assert not jax.distributed.is_initialized()
    with pytest.raises(ConfigError, match=re.escape("distributed.process_id=3 must be in 0..0")):
        initialize({"distributed": {"num_processes": 1, "process_id": 3}})
