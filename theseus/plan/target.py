"""Hardware a run is planned for but not run on (``mesh.target``): a TPU slice or GPU nodes, as
compile-only devices from ``jax.experimental.topologies`` (nothing is allocated on them).

Names: ``tpu:<version>-<n>`` as Google Cloud sells slices (``v5e-8``, ``v6e-16``: n chips;
``v4-32``, ``v5p-128``: n TensorCores, two a chip), and ``gpu:<model>x<gpus>[x<nodes>]``
(``h100x8``, ``h100x8x4``: four nodes of eight). TPU topologies need libtpu, GPU ones the CUDA
plugin (the ``plan`` extra); a GPU is described to XLA by a spec shipped in ``gpu_specs/``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

from theseus.base.hardware import NODE_NETWORK, Chip, lookup
from theseus.base.native_output import is_cuda_driver_noise, is_off_tpu_vm_noise, native_lines_dropped
from theseus.config import ConfigError

SPECS = Path(__file__).parent / "gpu_specs"
TPU_VERSIONS = {"v4": (3, 2), "v5e": (2, 1), "v5p": (3, 2), "v6e": (2, 1)}  # version -> (torus dims, cores per chip)
SINGLE_HOST_8 = ("v5e", "v6e")  # versions sold as one host of up to 8 chips (v5litepod-1, -4, -8; v6e-1, -4, -8)
GPU_MODELS = ("a100", "b200", "h100", "h200")
EXAMPLES = "tpu:v4-32, tpu:v5e-8, tpu:v5p-128, tpu:v6e-16, gpu:a100x8, gpu:h100x8, gpu:h200x8, gpu:b200x8, gpu:h100x8x4"
INSTALL = "pip install 'theseus[plan]'"


@dataclasses.dataclass(frozen=True)
class Target:
    """A planned topology: its compile-only ``devices``, their chip, and how many devices a chip
    is (libtpu shows a TPU v4's two TensorCores as two devices)."""

    name: str
    devices: list
    chip: Chip
    per_chip: int = 1
    network: float | None = None  # bytes/s each device sends off its node (GPUs over several nodes)

    @property
    def hbm(self) -> float:
        return self.chip.hbm / self.per_chip

    @property
    def hbm_bandwidth(self) -> float:
        return self.chip.hbm_bandwidth / self.per_chip

    @property
    def interconnect(self) -> float:
        """Bytes/s one device sends to the others: the node network's when the job spans nodes."""
        return self.network or self.chip.interconnect / self.per_chip

    def peak(self, dtype) -> float | None:
        peak = self.chip.peak(dtype)
        return None if peak is None else peak / self.per_chip

    @property
    def process_count(self) -> int:
        return len({d.process_index for d in self.devices})


def parse(name: str) -> tuple[str, str, int, int]:
    """``"tpu:v5e-8"`` -> ``("tpu", "v5e", 8, 1)``; ``"gpu:h100x8x4"`` -> ``("gpu", "h100", 8, 4)``;
    ConfigError naming ``mesh.target`` for a name, or a size, that is not sold."""
    tpu = re.fullmatch(r"tpu:(v\d+[a-z]?)-(\d+)", name)
    gpu = re.fullmatch(r"gpu:([a-z]\d+)x(\d+)(?:x(\d+))?", name)
    if tpu and tpu.group(1) in TPU_VERSIONS:
        version, n = tpu.group(1), int(tpu.group(2))
        cores = TPU_VERSIONS[version][1]
        chips = n // cores
        if n % cores or chips < 1 or chips & (chips - 1):
            unit = "TensorCores (two a chip)" if cores > 1 else "chips"
            raise ConfigError(f"mesh.target={name}: a TPU {version} slice of {n} {unit} is not sold: give a power "
                              f"of two of chips, e.g. mesh.target=tpu:{version}-{8 * cores}")
        return "tpu", version, n, 1
    if gpu and gpu.group(1) in GPU_MODELS:
        model, gpus, nodes = gpu.group(1), int(gpu.group(2)), int(gpu.group(3) or 1)
        if gpus < 1 or nodes < 1:
            raise ConfigError(f"mesh.target={name}: {gpus} GPUs a node on {nodes} nodes is no machine: give at "
                              f"least one of each, e.g. mesh.target=gpu:{model}x8 or gpu:{model}x8x4 (four nodes)")
        return "gpu", model, gpus, nodes
    raise ConfigError(f"mesh.target={name} is not a known target: use tpu:<{'|'.join(TPU_VERSIONS)}>-<n> or "
                      f"gpu:<{'|'.join(GPU_MODELS)}>x<gpus per node>[x<nodes>], e.g. {EXAMPLES}")


def torus(chips: int, dims: int) -> str:
    """The slice's chip grid (``chips`` a power of two, as ``parse`` checks), as even as it goes:
    8 chips in 2 dims -> ``"2x4"``, 64 in 3 -> ``"4x4x4"``."""
    sides = [1] * dims
    for i in range(int(math.log2(chips))):
        sides[i % dims] *= 2
    return "x".join(map(str, sorted(sides)))


def host_bounds(version: str, shape: str) -> dict[str, list[int]]:
    """libtpu's ``chips_per_host_bounds`` for a slice of ``shape`` (``"2x4"``): a slice of at most one
    host (4 chips; 8 for v5e and v6e, sold as one host of 8) is that host, of the slice's own shape;
    a larger one takes libtpu's default hosts of 4 chips (2x2x1)."""
    sides = [int(side) for side in shape.split("x")]
    if math.prod(sides) <= (8 if version in SINGLE_HOST_8 else 4):
        return {"chips_per_host_bounds": (sides + [1, 1])[:3]}
    return {}


def target_named(name: str) -> Target:
    """The compile-only devices of target ``name`` (ConfigError for an unknown name or a missing extra)."""
    kind, model, n, nodes = parse(name)
    import jax

    jax.config.update("jax_enable_compilation_cache", False)  # a plan writes nothing (nor could it reload one)
    try:  # what libtpu and the CUDA plugin say of the machine they are not on is dropped
        with native_lines_dropped(lambda line: is_off_tpu_vm_noise(line) or is_cuda_driver_noise(line)):
            devices, per_chip = _devices(kind, model, n, nodes)
    except (RuntimeError, NotImplementedError, ImportError) as exc:
        if "not installed" in str(exc) or "not implemented" in str(exc) or isinstance(exc, ImportError):
            raise ConfigError(f"mesh.target={name} needs {'libtpu' if kind == 'tpu' else 'the CUDA plugin'} to "
                              f"compile for it: {INSTALL}") from None
        raise
    chip = lookup(devices[0].device_kind)
    if chip is None or chip.hbm is None:
        raise ConfigError(f"mesh.target={name}: its devices ({devices[0].device_kind}) have no memory and "
                          f"bandwidth in theseus.base.hardware.CHIPS")
    network = NODE_NETWORK.get(chip.name) if nodes > 1 else None
    return Target(name, list(devices), chip, per_chip, network)


def _devices(kind: str, model: str, n: int, nodes: int) -> tuple[list, int]:
    """The topology's compile-only devices and how many of them a chip is."""
    from jax.experimental import topologies

    if kind == "tpu":
        dims, cores = TPU_VERSIONS[model]
        shape = torus(n // cores, dims)
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # no chip to lock: concurrent plans may run
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # not on a TPU VM: no metadata server to ask
        try:  # libtpu shows v4's two TensorCores a chip as two devices; v5p's as one (megacore)
            devices = topologies.get_topology_desc(f"{model}:{shape}", "tpu", **host_bounds(model, shape)).devices
        except RuntimeError as exc:  # JaxRuntimeError: a layout libtpu does not make
            reason = next((line for line in str(exc).splitlines() if line.strip()), "")
            raise ConfigError(f"mesh.target=tpu:{model}-{n}: libtpu cannot lay out {shape} chips ({reason}): "
                              f"give one it makes, e.g. {', '.join(f'tpu:{model}-{k * cores}' for k in (1, 4, 8, 16))}")
        return list(devices), len(devices) // (n // cores)
    spec = (SPECS / f"{model}.txtpb").read_text()
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # deviceless: no CUDA runtime needed
    devices = topologies.get_topology_desc(platform="cuda", topology=f"1x{nodes}x{n}", target_config=spec).devices
    return list(devices), 1
