"""Which JAX platforms a process starts: on a host without an accelerator, only the CPU.

A fresh install of the ``plan`` extra holds libtpu and JAX's CUDA plugin (they compile for
``mesh.target`` hardware that is not attached). Left to itself, JAX starts every backend it
finds on its first use of a device, and on a machine without CUDA libraries or TPU chips each
plugin says so: the CUDA plugin's ``Unable to load CUDA. Is it installed?`` traceback, libtpu's
``TPU_WORKER_HOSTNAMES`` lines. ``import theseus`` (the first import of every entry point)
calls ``cpu_only_platforms``, so every command and every notebook chooses its platforms the
same way, before any backend starts. Kept free of heavy imports: ``import theseus`` is light.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

NVIDIA = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver sees


def visible_gpus(environ: Mapping[str, str] = os.environ, driver: Path = NVIDIA) -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set (ids or UUIDs), else
    every GPU the NVIDIA driver lists (indices); ``[]`` on a host without one."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [d for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    return [str(i) for i in range(len(list(driver.iterdir())))] if driver.is_dir() else []


def attached_accelerator(environ: Mapping[str, str] = os.environ, driver: Path = NVIDIA,
                         dev: Path = Path("/dev")) -> str | None:
    """``"tpu"`` or ``"gpu"`` where this host has one (its device files: nothing is opened), else None."""
    if any(dev.glob("accel[0-9]*")) or any((dev / "vfio").glob("[0-9]*")):
        return "tpu"
    return "gpu" if visible_gpus(environ, driver) else None


def cpu_only_platforms(environ: MutableMapping[str, str] = os.environ, driver: Path = NVIDIA,
                       dev: Path = Path("/dev")) -> None:
    """On a host with neither an NVIDIA GPU nor a TPU, ``JAX_PLATFORMS=cpu`` (unless set): JAX
    then starts no TPU or CUDA backend that an installed libtpu or CUDA plugin would try, and
    warn about, on every run. ``mesh.target`` still compiles for them (their topologies need
    no backend)."""
    if "JAX_PLATFORMS" in environ or attached_accelerator(environ, driver, dev):
        return
    environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:  # imported already: its config read the environment then
        sys.modules["jax"].config.update("jax_platforms", "cpu")
