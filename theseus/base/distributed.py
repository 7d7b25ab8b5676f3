"""Multi-host initialisation: one process per host under ``jax.distributed``, one global mesh.

Where JAX can detect the job (SLURM, Open MPI, a Cloud TPU pod) the ``distributed.*`` keys may
stay unset; elsewhere ``distributed.coordinator``, ``num_processes`` and ``process_id`` join a
process to a job by hand (``python -m theseus.launch`` sets them for local processes). Without
either, a run is a single process. ``initialize`` must run before anything touches a device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import jax
from jax._src import clusters  # JAX's own detection: what initialize() with no arguments reads
from omegaconf import DictConfig

from theseus.base.native_output import drop_native_lines, is_gloo_noise
from theseus.config import ConfigError, Configurable, configured, field

# The environments whose jobs join without settings, in the order JAX tries them.
CLUSTERS = (clusters.OmpiCluster, clusters.SlurmCluster, clusters.GkeTpuCluster, clusters.GceTpuCluster)
TPU_CLUSTERS = (clusters.GkeTpuCluster, clusters.GceTpuCluster)
GRACE = 30  # seconds JAX's own deadline trails ours, so that ours reports first
KEYS = {"coordinator_address": "coordinator", "num_processes": "num_processes", "process_id": "process_id"}


@dataclasses.dataclass(frozen=True)
class DistributedConfig(Configurable):
    """Multi-host settings for ``jax.distributed``; unset: detected, or a single process."""

    RESUMABLE: ClassVar[bool] = True  # every key may change on resuming: none alters the numbers

    coordinator: str | None = field("distributed.coordinator", default=None, help="HOST:PORT of process 0; unset: detected")
    num_processes: int | None = field("distributed.num_processes", default=None, help="number of processes; unset: detected")
    process_id: int | None = field("distributed.process_id", default=None, help="this process's index; unset: detected")
    timeout: int = field("distributed.timeout", default=300, help="seconds to wait for every process to join")


def detected_processes() -> int | None:
    """The process count of the SLURM, Open MPI or TPU-pod job this process belongs to, else None.

    A TPU slice's hosts are listed in its own variables (``TPU_WORKER_HOSTNAMES``): a one-slice job
    is counted from them, so a one-host run never asks the cloud's metadata server, which JAX's
    TPU detection does for the slice count (and a host outside Google's network cannot reach).
    Where JAX must ask and cannot, ConfigError names the ``distributed.*`` keys that say it instead.
    """
    env = None
    try:
        env = next((env for env in CLUSTERS if env.is_env_present()), None)
        return None if env is None else tpu_slice_processes(env) or env.get_process_count()
    except Exception as exc:  # a metadata request that fails, a variable that does not parse
        name = "JAX's cluster detection" if env is None else env.__name__
        reason = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)[:200]
        raise ConfigError(f"this host looks like part of a cluster job ({name}) but its size could not be read "
                          f"({type(exc).__name__}: {reason}): for a one-host run set distributed.num_processes=1; "
                          f"for several hosts set distributed.coordinator, num_processes and process_id") from None


def tpu_slice_processes(env: type, environ: Mapping[str, str] = os.environ) -> int | None:
    """The hosts of a single TPU slice, from its variables alone; None where they do not say
    (not a TPU job, or a multislice job whose slice count only the metadata holds)."""
    hosts = environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES")
    multislice = any(key in environ for key in ("MEGASCALE_NUM_SLICES", "MEGASCALE_COORDINATOR_ADDRESS"))
    if not issubclass(env, TPU_CLUSTERS) or not hosts or multislice:
        return None
    return len(hosts.split(","))


def join_arguments(config: DistributedConfig, detected: int | None) -> dict[str, Any] | None:
    """Keyword arguments of ``jax.distributed.initialize``, or None for a single process.

    ``detected`` is the process count of a detected cluster job (JAX fills the keys left
    unset from it), None outside one. ConfigError, in one line, for an impossible setting.
    """
    check_distributed(config)
    given = {arg: getattr(config, key) for arg, key in KEYS.items() if getattr(config, key) is not None}
    if not given:
        return {} if (detected or 1) > 1 else None
    missing = [f"distributed.{key}" for arg, key in KEYS.items() if arg not in given]
    if missing and detected is None:
        raise ConfigError(f"{', '.join(missing)} unset and no SLURM, Open MPI or TPU-pod job detected: "
                          f"set distributed.coordinator, num_processes and process_id together")
    return given


def check_distributed(config: DistributedConfig) -> None:
    """ConfigError naming the key for a malformed coordinator, count, index or timeout."""
    n, index = config.num_processes, config.process_id
    if config.coordinator is not None:
        parse_address(config.coordinator)
    if n is not None and n < 1:
        raise ConfigError(f"distributed.num_processes must be at least 1, got {n}")
    if index is not None and (index < 0 or (n is not None and index >= n)):
        bound = f"in 0..{n - 1} (distributed.num_processes={n})" if n else "0 or more"
        raise ConfigError(f"distributed.process_id={index} must be {bound}")
    if config.timeout <= 0:
        raise ConfigError(f"distributed.timeout must be a positive number of seconds, got {config.timeout}")


def parse_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` (IPv6 hosts in brackets); ConfigError otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"distributed.coordinator={address} must be HOST:PORT of process 0, e.g. 10.0.0.1:1234")
    return host.strip("[]"), int(port)


def initialize(cfg: DictConfig | Mapping) -> None:
    """Join the job the composed config ``cfg`` describes or the environment implies.

    A no-op for a single process, or when this process has joined already. A wrong setting
    raises ConfigError; a job that does not assemble within ``distributed.timeout`` seconds
    (an unreachable coordinator, a process missing) ends this process with one line. Once
    joined, gloo's connection lines are dropped from the console.
    """
    if jax.distributed.is_initialized():
        return
    config = configured(DistributedConfig, cfg)
    check_distributed(config)
    alone = config.num_processes == 1 and config.coordinator is None  # said to be one process: nothing to detect
    arguments = None if alone else join_arguments(config, detected_processes())
    if arguments is None:
        return
    if arguments.get("process_id") == 0:
        check_port_free(parse_address(arguments["coordinator_address"])[1])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
    with deadline(config.timeout, _who(config)):
        try:
            jax.distributed.initialize(**arguments, initialization_timeout=config.timeout + GRACE)
        except Exception as exc:  # JAX raises several kinds; each means: not joined
            reason = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise ConfigError(f"{_who(config)} could not join the distributed job: {reason}") from exc
    drop_native_lines(is_gloo_noise)  # gloo announces each connection it makes


def check_port_free(port: int) -> None:
    """ConfigError when something already listens on ``port``, where process 0 must serve."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closing socket is no obstacle
        try:
            probe.bind(("", port))
        except OSError as exc:
            raise ConfigError(f"distributed.coordinator: port {port} is in use on process 0's host "
                              f"({exc.strerror}): choose a free port") from exc


@contextlib.contextmanager
def deadline(seconds: float, who: str) -> Iterator[None]:
    """End the process with one line on stderr (exit 2) unless the block finishes within ``seconds``.

    JAX's own timeout aborts with a C++ stack trace; a blocked native call cannot be
    interrupted, but this timer thread runs while it waits.
    """
    def expire() -> None:
        print(f"theseus: error: {who} could not join the distributed job within {seconds} s: check that "
              f"distributed.coordinator is process 0's reachable HOST:PORT and that every process was started "
              f"(or raise distributed.timeout)", file=sys.stderr, flush=True)
        os._exit(2)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _who(config: DistributedConfig) -> str:
    """``process 1 of 2 (coordinator 10.0.0.1:1234)``, with what is known."""
    index = "process" if config.process_id is None else f"process {config.process_id}"
    count = "" if config.num_processes is None else f" of {config.num_processes}"
    where = " (coordinator detected)" if config.coordinator is None else f" (coordinator {config.coordinator})"
    return index + count + where
