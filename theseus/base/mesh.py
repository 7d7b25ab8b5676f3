"""The device mesh from config: axes data, fsdp, expert, tensor."""

from __future__ import annotations

import dataclasses
from typing import ClassVar
import math
import os

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding

from theseus.base.axis import BATCH_MESH_AXES, LOGICAL_AXES, MESH_AXES, ShardingPlan
from theseus.base.processor import processor
from theseus.config import PLANNING, ConfigError, Configurable, field
from theseus.config.errors import suggest


@dataclasses.dataclass(frozen=True)
class MeshConfig(Configurable):
    """The shape of the device mesh; its product must equal the device count."""

    RESUMABLE: ClassVar[bool] = True  # every key may change on resuming: none alters the numbers

    data: int = field("mesh.data", default=-1, help="data-parallel size; -1: the remaining devices")
    fsdp: int = field("mesh.fsdp", default=1, help="fully-sharded data-parallel size; -1: the remaining devices")
    expert: int = field("mesh.expert", default=1,
                        help="expert-parallel size: mixture-of-experts layers split their experts over it (it also "
                             "splits the batch); -1: the remaining devices")
    tensor: int = field("mesh.tensor", default=1, help="tensor-parallel size; -1: the remaining devices")
    rules: dict = field("mesh.rules", default={}, help="logical axis -> mesh axes, overriding the model's plan")
    cpu_devices: int | None = field(
        "mesh.cpu_devices", default=None,
        help="on a CPU: this many devices of the host's cores, one thread each; None: chosen from the cores and "
             "the batch when the mesh is left data-parallel (1: one device on every core, JAX's default)",
    )
    target: str | None = field(
        "mesh.target", default=None,
        help="with trainer.dry_run: compile for hardware this machine lacks and predict its step (tpu:v5e-8, "
             "tpu:v5p-128, gpu:h100x8, gpu:h100x8x4, ...; needs the plan extra); None: this machine's devices",
        role=PLANNING,
    )

    def __post_init__(self):
        """Each size positive or -1 (one of them at most), ``cpu_devices`` positive (or None, and
        unset with a ``target``), ``target`` unset or named; each rule maps a logical axis to mesh
        axes (a name, a list of names, or null). What the devices decide is ``shape``'s."""
        sizes = {axis: getattr(self, axis) for axis in MESH_AXES}
        bad = [f"mesh.{axis}={size}" for axis, size in sizes.items() if size == 0 or size < -1]
        if bad:
            given = " x ".join(f"{axis}={size}" for axis, size in sizes.items())
            raise ConfigError(f"{', '.join(bad)}: mesh sizes must be positive (or -1: the remaining devices); "
                              f"the mesh was {given}")
        free = [axis for axis, size in sizes.items() if size == -1]
        if len(free) > 1:
            raise ConfigError(f"{' and '.join(f'mesh.{axis}=-1' for axis in free)}: at most one -1 (the remaining "
                              f"devices) is allowed: give the other mesh axes a size")
        if self.target == "":
            raise ConfigError("mesh.target is empty: name the hardware to plan for (e.g. mesh.target=tpu:v5e-8, "
                              "gpu:h100x8), or null for this machine's devices")
        if self.target and self.cpu_devices is not None:
            raise ConfigError(f"mesh.cpu_devices={self.cpu_devices} sizes this machine's CPU backend, but "
                              f"mesh.target={self.target} plans for that target's devices: drop mesh.cpu_devices")
        if self.cpu_devices is not None and self.cpu_devices < 1:
            raise ConfigError(f"mesh.cpu_devices={self.cpu_devices}: give a positive number of CPU devices "
                              f"(the host's cores), or null for JAX's default")
        for logical, axes in self.rules.items():
            names = [] if axes is None else [axes] if isinstance(axes, str) else axes
            if not isinstance(names, list | tuple) or any(axis not in MESH_AXES for axis in names):
                raise ConfigError(f"mesh.rules.{logical}={axes!r} is not a mesh axis: use one of "
                                  f"{', '.join(MESH_AXES)}, a list of them, or null (replicated)")
            if len(set(names)) < len(names):
                raise ConfigError(f"mesh.rules.{logical}={axes!r} names a mesh axis twice: an axis splits an array "
                                  f"once; give each at most once, e.g. mesh.rules.{logical}=[{names[0]}]")

    def apply(self, plan: ShardingPlan) -> ShardingPlan:
        """The run's plan: the model's ``plan``, the batch over ``BATCH_MESH_AXES``, and
        ``mesh.rules`` replacing their entries. A rule for a logical axis that neither theseus
        nor the plan names is a ConfigError: a misspelt axis would silently shard nothing."""
        plan = plan.merge(ShardingPlan(batch=BATCH_MESH_AXES))
        known = {*LOGICAL_AXES, *plan}
        for logical in self.rules:
            if logical not in known:
                close = suggest(logical, known, n=1)
                hint = f"did you mean mesh.rules.{close[0]}?" if close else f"the logical axes: {', '.join(sorted(known))}"
                raise ConfigError(f"mesh.rules.{logical}: no parameter or activation has the logical axis "
                                  f"{logical!r}; {hint}")
        return plan.override(self.rules)

    def shape(self, n_devices: int, sizable: bool = False) -> dict[str, int]:
        """``{"data": d, "fsdp": f, "expert": e, "tensor": t}`` with -1 resolved; ConfigError when
        impossible (``sizable``: the devices are one process's CPU devices, which ``mesh.cpu_devices``
        makes as many as the mesh needs: the error says so)."""
        sizes = {axis: getattr(self, axis) for axis in MESH_AXES}
        given = " x ".join(f"{axis}={size}" for axis, size in sizes.items())
        free = [axis for axis, size in sizes.items() if size == -1]
        fixed = math.prod(size for size in sizes.values() if size != -1)
        resize = (lambda n: f", or set mesh.cpu_devices={n}: on a CPU, it sets how many devices there are "
                            f"(the host's cores split among them)") if sizable else (lambda n: "")
        if free:
            if n_devices % fixed:
                raise ConfigError(f"mesh {given} does not divide the {n_devices} device{'s' * (n_devices != 1)}: "
                                  f"fix mesh.* so the product is {n_devices}{resize(fixed)}")
            sizes[free[0]] = n_devices // fixed
        if math.prod(sizes.values()) != n_devices:
            raise ConfigError(
                f"mesh {given} needs {math.prod(sizes.values())} devices but {n_devices} are present: "
                f"set mesh.data/fsdp/tensor so their product is {n_devices} (-1 takes the rest)"
                f"{resize(math.prod(sizes.values()))}"
            )
        return sizes


def use_cpu_devices(n: int | None, given: bool = True) -> None:
    """Make JAX's CPU backend ``n`` devices (``jax_num_cpu_devices``); None leaves JAX's default.

    One CPU device runs its many small ops one after another on one core; a device per core,
    with the batch split over them, keeps every core busy (their steps compiled with
    ``compiler_options``). The backend starts once per process: after that, ``n`` must be
    the devices it has, if ``given`` (by mesh.cpu_devices; an automatic count yields).
    """
    if n is None:
        return
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # started already (by XLA_FLAGS' count, or another mesh.cpu_devices)
        have = len(jax.devices("cpu"))
        if have == n or not given:
            return
        raise ConfigError(f"mesh.cpu_devices={n}, but JAX's CPU backend has started with {have} devices, and it "
                          f"starts once per process: use the same mesh.cpu_devices for every job of the process "
                          f"and run no JAX work before the trainer (or set JAX_NUM_CPU_DEVICES={n})") from None


def auto_cpu_devices(config: MeshConfig, examples: int, cores: int | None = None) -> int | None:
    """The CPU device count a run gets when ``mesh.cpu_devices`` is unset: the most devices, at
    most one per physical core (``theseus.base.processor``: a core's SMT siblings share its
    FMA units, so a device each would halve every device's products), that split ``examples``
    (a micro-batch) evenly. None (JAX's default) where the choice is not theseus's to make: a
    mesh given sizes, a count set by ``XLA_FLAGS`` or ``JAX_NUM_CPU_DEVICES``, several
    processes. On a GPU or TPU the count is the idle CPU backend's: the mesh is made of the
    accelerator's devices."""
    pinned = "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    laid_out = any(getattr(config, axis) != getattr(MeshConfig, axis) for axis in MESH_AXES)  # not the defaults
    if (config.cpu_devices is not None or pinned or laid_out or jax.config.jax_num_cpu_devices != -1
            or jax.distributed.is_initialized()):
        return None
    host = processor()
    cores = cores or (host.cores if host else len(os.sched_getaffinity(0)))
    return max(n for n in range(1, cores + 1) if examples % n == 0)


def compiler_options(devices: list) -> dict[str, bool]:
    """XLA options for steps on ``devices``: with several CPU devices, each device's matrix
    products on one thread (the other cores are the other devices'; sharing them costs more
    than it gives)."""
    on_cpu = devices[0].platform == "cpu" and len(devices) > 1
    return {"xla_cpu_multi_thread_eigen": False} if on_cpu else {}


def sizable(devices: list) -> bool:
    """Whether ``mesh.cpu_devices`` sets how many ``devices`` there are: one process's CPU devices."""
    return devices[0].platform == "cpu" and jax.process_count() == 1


def make_mesh(config: MeshConfig, devices: list | None = None) -> Mesh:
    """A Mesh over ``devices`` (default: all) with axes (data, fsdp, expert, tensor)."""
    devices = jax.devices() if devices is None else devices
    sizes = config.shape(len(devices), sizable(devices))
    shape = tuple(sizes[axis] for axis in MESH_AXES)
    try:
        grid = mesh_utils.create_device_mesh(shape, devices)
    except Exception:  # shapes the topology-aware helper cannot place: plain order
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, MESH_AXES)


def on_devices(local: np.ndarray, sharding: NamedSharding, shape: tuple[int, ...]) -> jax.Array:
    """The global array of ``shape`` laid out by ``sharding`` whose part on this process's
    devices is ``local``; with one process a plain ``device_put``, the cheaper call."""
    if jax.process_count() == 1:
        return jax.device_put(local, sharding)
    return jax.make_array_from_process_local_data(sharding, local, shape)
