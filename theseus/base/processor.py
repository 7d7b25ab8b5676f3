"""The host processor: its model, vector extensions, clock and cores, and its vector peak.

A CPU's peak is ``cores x clock x FLOPs per cycle``, the FLOPs per cycle of the widest FMA
units the processor reports (``/proc/cpuinfo``'s flags): two FMA units a core (every x86 core
since Haswell and Zen; Arm's Neoverse and Apple's cores have two or more), each ``width / 32``
float32 lanes wide and counting two FLOPs (a multiply and an add) per lane:

- AVX-512 on Intel and on AMD from Zen 5 (family 26): 512-bit units, 64 float32 FLOPs a cycle;
- AVX-512 on AMD Zen 4 (family 25: its 512-bit instructions run on 256-bit units, "double
  pumped"), AVX2 + FMA: 256-bit, 32; Zen 1 (family 23, models below 0x30: 128-bit units), SSE,
  Arm's NEON: 128-bit, 16.

bfloat16 products run at twice the float32 rate with AVX512_BF16 (``VDPBF16PS``: two products a
lane) and at 1024 FLOPs a cycle on Intel's AMX tiles (``amx_bf16``); without either they are
float32 products. ``parse`` takes the clock the system reports (cpufreq's maximum, else the
model name's ``@ x.xxGHz``, else ``cpu MHz``); ``running`` the one the cores run at with their
FMA units busy, measured (``theseus.base.clock``), where it can be: a reported clock is often
the base clock (a virtual machine's ``cpu MHz``), and a peak of it would put MFU too high.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from theseus.base.clock import CACHE, keep_best, measure_ghz, vector_width

CPUINFO = Path("/proc/cpuinfo")
CPUFREQ = Path("/sys/devices/system/cpu")
FMA_UNITS = 2  # per core
AMX_BF16_FLOPS = 1024  # per cycle per core: Intel's TMUL, 16x32 bf16 products into 16x16 float32 per 16 cycles x 2
# the flags that decide a peak or a default, widest first (what a benchmark records beside its figures)
VECTOR_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx2", "fma", "avx", "sse4_2",
                "sve", "asimd", "bf16")


@dataclasses.dataclass(frozen=True)
class Processor:
    """One host's processor, as its operating system describes it."""

    model: str  # "AMD EPYC 9R14", "Intel(R) Xeon(R) Platinum 8488C"
    vendor: str  # "AuthenticAMD", "GenuineIntel", "" (not x86, or not reported)
    family: int | None  # x86 family (AMD: 23 Zen 1-2, 25 Zen 3-4, 26 Zen 5)
    model_number: int | None
    flags: frozenset[str] = dataclasses.field(repr=False)  # noqa: RUF009 (no default: only repr)
    cores: int  # physical cores this process may run on (SMT siblings share their FMA units)
    ghz: float | None
    clock: str  # where ``ghz`` comes from
    core_cpus: tuple[int, ...] = ()  # one logical CPU of each of those cores

    @property
    def extensions(self) -> list[str]:
        """The vector extensions it has among ``VECTOR_FLAGS``, widest first."""
        return [flag for flag in VECTOR_FLAGS if flag in self.flags]

    @property
    def fma_bits(self) -> int:
        """Width of its FMA units: 512, 256 or 128 bits (see the module's docstring)."""
        if "avx512f" in self.flags and not (self.vendor == "AuthenticAMD" and (self.family or 0) < 26):
            return 512
        if self.vendor == "AuthenticAMD" and self.family == 23 and (self.model_number or 0) < 0x30:
            return 128  # Zen 1: AVX2 on 128-bit units
        if {"avx2", "fma"} <= self.flags or "avx512f" in self.flags:
            return 256
        return 128

    @property
    def is_x86(self) -> bool:
        return bool(self.vendor) or "sse2" in self.flags

    def flops_per_cycle(self, dtype: Any) -> int:
        """Peak FLOPs a core does per cycle in ``dtype`` (float32 or bfloat16; float64 half of float32)."""
        float32 = FMA_UNITS * (self.fma_bits // 32) * 2
        name = jnp.dtype(dtype).name
        if name == "bfloat16":
            if "amx_bf16" in self.flags:
                return AMX_BF16_FLOPS
            return 2 * float32 if {"avx512_bf16", "bf16"} & self.flags else float32
        return float32 // 2 if name == "float64" else float32

    def peak(self, dtype: Any) -> float | None:
        """FLOP/s of every core this process may use, in ``dtype``; None when the clock or the
        vector units are unknown (no ``/proc/cpuinfo``, or neither an x86 nor an Arm processor)."""
        if self.ghz is None or not (self.is_x86 or "asimd" in self.flags):
            return None
        return self.cores * self.ghz * 1e9 * self.flops_per_cycle(dtype)

    def describe(self, dtype: Any) -> str:
        """How ``peak(dtype)`` is made, for a run's start table."""
        units = ("AMX-BF16 tiles" if jnp.dtype(dtype) == jnp.bfloat16 and "amx_bf16" in self.flags else
                 f"{FMA_UNITS} x {self.fma_bits}-bit FMA units" + (", AVX-512" if "avx512f" in self.flags else ""))
        return (f"{self.model}: {self.cores} core{'s' if self.cores > 1 else ''} x {self.ghz:.2f} GHz ({self.clock}) x "
                f"{self.flops_per_cycle(dtype)} {jnp.dtype(dtype).name} FLOP/cycle ({units})")


def parse(cpuinfo: str, cpus: Collection[int] | None = None, max_khz: float | None = None) -> Processor:
    """The processor ``cpuinfo`` (``/proc/cpuinfo``'s text) describes, counting the cores of
    ``cpus`` (logical CPU numbers; None: all); ``max_khz``: cpufreq's maximum, when known."""
    blocks = [dict(_fields(block)) for block in cpuinfo.strip().split("\n\n") if block.strip()]
    cpu_blocks = [b for b in blocks if "processor" in b and b["processor"].isdigit()]
    first = cpu_blocks[0] if cpu_blocks else (blocks[0] if blocks else {})
    mine = [b for b in cpu_blocks if cpus is None or int(b["processor"]) in cpus] or cpu_blocks
    cores: dict = {}  # each physical core's first logical CPU (SMT siblings share their core's FMA units)
    for i, b in enumerate(mine):
        cores.setdefault((b.get("physical id"), b["core id"]) if "core id" in b else i, int(b["processor"]))
    flags = frozenset((first.get("flags") or first.get("Features") or "").split())
    model = first.get("model name") or _arm_model(first) or platform.processor() or platform.machine()
    ghz, clock = None, ""
    if max_khz:
        ghz, clock = max_khz / 1e6, "cpufreq maximum"
    elif match := re.search(r"@\s*([\d.]+)\s*GHz", model):
        ghz, clock = float(match[1]), "model name"
    elif "cpu MHz" in first:
        ghz, clock = float(first["cpu MHz"]) / 1e3, "cpu MHz"
    return Processor(model=model, vendor=first.get("vendor_id", ""), family=_int(first.get("cpu family")),
                     model_number=_int(first.get("model")), flags=flags, cores=max(len(cores), 1), ghz=ghz,
                     clock=clock, core_cpus=tuple(sorted(cores.values())))


@functools.cache
def processor() -> Processor | None:
    """This host's processor (its cores: those this process may run on); None where the
    system does not describe it (no ``/proc/cpuinfo``: macOS, Windows)."""
    if not CPUINFO.is_file():
        return None
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    khz = [float(path.read_text()) for cpu in (cpus or [0])
           if (path := CPUFREQ / f"cpu{cpu}" / "cpufreq" / "cpuinfo_max_freq").is_file()]
    return parse(CPUINFO.read_text(), cpus, max(khz) if khz else None)


@functools.cache
def running(cpu: Processor) -> Processor:
    """``cpu`` at the clock its cores run at with their FMA units busy: the best measured on this
    machine (``theseus.base.clock``, a tenth of a second, once a process); ``cpu`` as reported
    where nothing can be measured (no x86 with AVX2 or AVX-512, no executable page)."""
    width = vector_width(cpu.flags)
    ghz = measure_ghz(width, list(cpu.core_cpus), cpu.flops_per_cycle(jnp.float32)) if width and cpu.core_cpus else None
    if ghz is None:
        return cpu
    key = f"{cpu.model}|{cpu.vendor} {cpu.family} {cpu.model_number}|{cpu.cores} cores|{width}"
    return dataclasses.replace(cpu, ghz=keep_best(CACHE, key, ghz), clock="measured, FMA units busy")


def _fields(block: str):
    for line in block.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            yield key.strip(), value.strip()


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _arm_model(block: dict[str, str]) -> str | None:
    """An Arm core's name from its implementer and part numbers (``/proc/cpuinfo`` has no model name)."""
    if "CPU implementer" not in block:
        return None
    return f"Arm (implementer {block['CPU implementer']}, part {block.get('CPU part', '?')})"
