"""Peak FLOP/s per device: a table of accelerators, a CPU's vector peak (``processor``), and a
measured peak for the rest; and the choices that need a particular backend (``check_attention_impl``).

The table is keyed by the strings JAX reports as ``device.device_kind``. Figures are dense
(no structured sparsity) and per JAX device: one chip, except TPU v2/v3 and TPU7x, whose
chips hold two TensorCores that JAX exposes as two devices. ``fp32`` is the rate of float32
matrix products at JAX's default precision, which trades accuracy for speed: TF32 tensor
cores on NVIDIA Ampere and later, one bfloat16 pass on TPU.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from theseus.base.clock import CACHE_DIR, keep_best
from theseus.base.processor import processor, running
from theseus.config import ConfigError


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator: its name, the device kinds it answers to, its dense peaks."""

    name: str
    pattern: str  # a regular expression the whole device kind must match (case-insensitive)
    bf16: float
    fp32: float
    hbm: float | None = None  # bytes of device memory
    hbm_bandwidth: float | None = None  # bytes/s between device memory and the cores
    interconnect: float | None = None  # bytes/s a device sends to its peers in one slice or node (ICI, NVLink)

    def peak(self, dtype: Any) -> float | None:
        """Dense peak FLOP/s in ``dtype``; None for a dtype not tabled (only bf16 and f32 are)."""
        column = {"bfloat16": "bf16", "float32": "fp32"}.get(jnp.dtype(dtype).name)
        return getattr(self, column) if column else None


# Patterns are anchored (full match) and exclusive: "NVIDIA H100" cannot take "NVIDIA H200" or
# "NVIDIA GH200", "TPU v5 lite" (v5e) cannot take v5p's "TPU v5". Sources: the vendors' data
# sheets (NVIDIA quotes tensor-core rates with 2:4 sparsity; these are half of those).
# Memory, its bandwidth and the interconnect (given where a planned run needs them): Google
# Cloud's TPU system-architecture pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e, tpu7x:
# "HBM capacity", "HBM bandwidth", "ICI bandwidth per chip", bits/s over 8), and NVIDIA's data
# sheets (A100: 80 GB, 2,039 GB/s; H100 SXM: 80 GB, 3.35 TB/s; H200 SXM: 141 GB, 4.8 TB/s;
# B200 (HGX): 180 GB, 8 TB/s; NVLink 600 / 900 / 900 / 1,800 GB/s, both directions: half each
# way is what one GPU sends). TPU7x's figures are per chip halved: JAX shows two devices a chip.
GB = 1e9
GIB = 2**30
CHIPS: tuple[Chip, ...] = (
    Chip("TPU v2", r"TPU v2", 22.5e12, 22.5e12),
    Chip("TPU v3", r"TPU v3", 61.5e12, 61.5e12),
    Chip("TPU v4", r"TPU v4", 275e12, 275e12, 32 * GIB, 1200 * GB, 2400 / 8 * GB),
    Chip("TPU v5e", r"TPU v5( lite|e)", 197e12, 197e12, 16 * GIB, 819 * GB, 1600 / 8 * GB),
    Chip("TPU v5p", r"TPU v5p?", 459e12, 459e12, 95 * GIB, 2765 * GB, 4800 / 8 * GB),
    Chip("TPU v6e", r"TPU v6( lite|e)", 918e12, 918e12, 32 * GIB, 1640 * GB, 3584 / 8 * GB),
    Chip("TPU7x", r"TPU ?v?7x", 1153.5e12, 1153.5e12, 96 * GIB, 3690 * GB, 600 * GB),
    Chip("NVIDIA A10", r"NVIDIA A10", 125e12, 62.5e12),
    Chip("NVIDIA A100", r"NVIDIA A100([- ].*)?", 312e12, 156e12, 80 * GB, 2039 * GB, 300 * GB),
    Chip("NVIDIA L4", r"NVIDIA L4", 121e12, 60e12),
    Chip("NVIDIA L40", r"NVIDIA L40", 181e12, 90.5e12),
    Chip("NVIDIA L40S", r"NVIDIA L40S", 362e12, 183e12),
    Chip("NVIDIA H100 SXM", r"NVIDIA H100(?!.*(PCIe|NVL)).*", 989.5e12, 494.5e12, 80 * GB, 3350 * GB, 450 * GB),
    Chip("NVIDIA H100 PCIe", r"NVIDIA H100.*PCIe.*", 756.5e12, 378e12),
    Chip("NVIDIA H100 NVL", r"NVIDIA H100.*NVL.*", 835.5e12, 417.5e12),
    Chip("NVIDIA GH200", r"NVIDIA GH200.*", 989.5e12, 494.5e12),
    Chip("NVIDIA H200 SXM", r"NVIDIA H200(?!.*NVL).*", 989.5e12, 494.5e12, 141 * GB, 4800 * GB, 450 * GB),
    Chip("NVIDIA H200 NVL", r"NVIDIA H200.*NVL.*", 835.5e12, 417.5e12),
    Chip("NVIDIA B200", r"NVIDIA B200.*", 2.25e15, 1.1e15, 180 * GB, 8000 * GB, 900 * GB),
)
# Between GPU nodes: one 400 Gb/s InfiniBand NDR port per GPU (NVIDIA DGX H100/H200/B200 and
# HGX reference designs; DGX A100 has 200 Gb/s HDR), bytes/s each way.
NODE_NETWORK = {"NVIDIA A100": 200 / 8 * GB, "NVIDIA H100 SXM": 400 / 8 * GB, "NVIDIA H200 SXM": 400 / 8 * GB,
                "NVIDIA B200": 400 / 8 * GB}

CACHE = CACHE_DIR / "peak_flops.json"


def lookup(device_kind: str) -> Chip | None:
    """The table entry whose pattern matches ``device_kind`` (spacing and case ignored)."""
    kind = " ".join(device_kind.split())
    return next((chip for chip in CHIPS if re.fullmatch(chip.pattern, kind, re.IGNORECASE)), None)


def measure_peak(dtype: Any, *, device: jax.Device | None = None, cache_path: Path | None = None) -> float:
    """FLOP/s of a chain of square matrix products in ``dtype`` on ``device`` (default: the
    default device): the highest of every calibration on this machine, cached in
    ``cache_path`` (a JSON file, default ``~/.cache/theseus/peak_flops.json``) under device
    kind, dtype and CPU count.

    Each call measures again (a fraction of a second) and keeps the best: a calibration taken
    while other work shared the cores reads low, and would inflate every later MFU.
    """
    device = device or jax.local_devices()[0]
    path = Path(cache_path) if cache_path is not None else CACHE
    key = f"{device.device_kind}|{jnp.dtype(dtype).name}|{_cpu_count()}"
    return keep_best(path, key, _measure(jnp.dtype(dtype), device))


def peak_flops(device: jax.Device, dtype: Any, override: float | None = None) -> tuple[float, str]:
    """The peak FLOP/s of ``device`` and its source: "config", "table: <chip>", "vector peak:
    <how>" (a CPU: cores x clock x FLOPs per cycle, ``theseus.base.processor``) or "measured"
    (a device none of those describes: a chain of matrix products, ``measure_peak``).

    A CPU's peak is the host's, shared by every local CPU device (``mesh.cpu_devices``, or
    simulated with ``--xla_force_host_platform_device_count``), so each device gets its share.
    """
    if override is not None:
        if not override > 0:
            raise ConfigError(f"trainer.peak_flops must be a positive FLOP/s per device, got {override!r}")
        return float(override), "config"
    chip = lookup(device.device_kind)
    peak = chip.peak(dtype) if chip else None
    if peak is not None:
        return peak, f"table: {chip.name}"
    shared = len(jax.local_devices(backend="cpu")) if device.platform == "cpu" else 1
    host = running(processor()) if device.platform == "cpu" and processor() else None
    if host is not None and host.peak(dtype):
        devices = f", shared by {shared} devices" if shared > 1 else ""
        return host.peak(dtype) / shared, f"vector peak: {host.describe(dtype)}{devices}"
    return measure_peak(dtype, device=device) / shared, "measured"


def _measure(dtype: np.dtype, device: jax.Device) -> float:
    """FLOP/s of ``n x n`` products, ``n`` doubling from 256 until one takes 2 ms (or n = 8192)."""
    n = 256
    while (seconds := _seconds_per_product(n, dtype, device)) < 2e-3 and n < 8192:
        n *= 2
    return 2 * n**3 / seconds


def _seconds_per_product(n: int, dtype: np.dtype, device: jax.Device, rounds: int = 8) -> float:
    """Best of three timings of ``rounds`` dependent products ``x <- x @ p`` (p a permutation:
    values never grow, and each product needs the last, so none can be skipped or hoisted)."""
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((n, n)).astype(dtype), device)
    p = jax.device_put(np.eye(n, dtype=dtype)[rng.permutation(n)], device)
    chain = jax.jit(lambda x, p: jax.lax.fori_loop(0, rounds, lambda _, y: y @ p, x))
    chain(x, p).block_until_ready()  # compile
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        chain(x, p).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best / rounds


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def backend() -> str:
    """The platform the program being traced runs on (``cpu``, ``gpu``, ``tpu``): the devices' of
    the mesh in force (``jax.set_mesh``: every step theseus compiles, a dry run's ``mesh.target``
    on a CPU host too), else JAX's default backend. What an ``auto`` setting chooses by: the
    activations' dtype, the attention kernel, the loss."""
    mesh = jax.sharding.get_abstract_mesh()
    return jax.default_backend() if mesh.empty else mesh.abstract_device.platform


def check_attention_impl(impl: str | None, dtype: Any) -> None:
    """Refuse ``architecture.attention_impl`` where the backend cannot run it (before any work):
    cuDNN's fused attention runs on NVIDIA GPUs only, in bfloat16 or float16 activations."""
    if impl != "cudnn":
        return
    platform = jax.default_backend()
    if platform != "gpu":
        raise ConfigError(f"architecture.attention_impl=cudnn needs an NVIDIA GPU, but the backend is {platform}: "
                          f"leave architecture.attention_impl=auto (the platform's fastest), or set "
                          f"architecture.attention_impl=xla")
    if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
        raise ConfigError(f"architecture.attention_impl=cudnn needs bfloat16 or float16 activations, not "
                          f"{jnp.dtype(dtype).name}: set architecture.dtype.activation=bfloat16, or "
                          f"architecture.attention_impl=xla")
