"""The clock a CPU's cores run at with their FMA units busy, measured in a tenth of a second.

The clock a system reports is seldom the one a training step runs at: ``cpu MHz`` is the base
clock in most virtual machines (2.60 GHz on an EPYC whose cores run at 4.1 GHz), a model name's
``@ 2.70GHz`` too, and cpufreq's maximum is one core's boost, not every core's under vector load.
So the cores are timed at what the peak counts: every core this process may use (one thread
pinned to each physical core, all at once), each repeating a loop of 12 independent
``vfmadd231ps`` on its widest vectors (AVX-512's zmm, else AVX2's ymm; 12 keep two FMA units of
latency 4 to 5 full), best of many 2 ms rounds over 0.1 s (a round shared with other work reads
low, never high). A core's FLOP/s over its FLOPs per cycle (``Processor.flops_per_cycle``) is
its clock: on a processor whose FMA units are narrower than the table says, the peak it makes is
still what the units do.

The loop is x86-64 machine code (below, with its assembly), run through ``ctypes`` from an
executable page; where no such page is allowed, or the processor is no x86 with AVX2 or
AVX-512, nothing is measured (None) and the reported clock stands. The best clock measured on
a machine is kept in ``~/.cache/theseus/cpu_clock.json`` (by processor, cores and vector width):
each measurement can only raise it.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path

CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "theseus"
CACHE = CACHE_DIR / "cpu_clock.json"
FMAS = 12  # independent FMAs an iteration of the loop issues
ROUND_S, BUDGET_S = 2e-3, 0.1  # a timed round, and the time every core spends rounds in

# fma_loop(n), System V calling convention (n in rdi): zero the accumulators 0-11 and the operands
# 14, 15 (zeros: no denormal can slow a product); n times vfmadd231ps {0..11}, 14, 15; dec rdi;
# jnz; vzeroupper (no AVX-to-SSE transition penalty afterwards); ret. Only caller-saved registers.
FMA_LOOP = {
    # vxorps ymmI, ymmI, ymmI (I = 0..11, 14, 15); vfmadd231ps ymmI, ymm14, ymm15 (I = 0..11); dec rdi; jne -65
    "ymm": "c5fc57c0c5f457c9c5ec57d2c5e457dbc5dc57e4c5d457edc5cc57f6c5c457ffc4413c57c0c4413457c9c4412c57d2c4412457db"
           "c4410c57f6c4410457ffc4c20db8c7c4c20db8cfc4c20db8d7c4c20db8dfc4c20db8e7c4c20db8efc4c20db8f7c4c20db8ff"
           "c4420db8c7c4420db8cfc4420db8d7c4420db8df48ffcf75bfc5f877c3",
    # vpxord zmmI, zmmI, zmmI (I = 0..11, 14, 15); vfmadd231ps zmmI, zmm14, zmm15 (I = 0..11); dec rdi; jne -77
    "zmm": "62f17d48efc062f17548efc962f16d48efd262f16548efdb62f15d48efe462f15548efed62f14d48eff662f14548efff"
           "62513d48efc062513548efc962512d48efd262512548efdb62510d48eff662510548efff62d20d48b8c762d20d48b8cf"
           "62d20d48b8d762d20d48b8df62d20d48b8e762d20d48b8ef62d20d48b8f762d20d48b8ff62520d48b8c762520d48b8cf"
           "62520d48b8d762520d48b8df48ffcf75b3c5f877c3",
}
LANES = {"ymm": 8, "zmm": 16}  # float32 lanes of a register


def vector_width(flags: frozenset[str]) -> str | None:
    """The register the loop runs on for a processor of ``flags`` (``/proc/cpuinfo``'s): zmm with
    AVX-512, ymm with AVX2 and FMA, None otherwise (or not on x86-64)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    return "zmm" if "avx512f" in flags else "ymm" if {"avx2", "fma"} <= flags else None


def measure_ghz(width: str, cpus: list[int], flops_per_cycle: int) -> float | None:
    """The clock (GHz) of the cores that ``cpus`` (one logical CPU each) are, their FMA units busy
    on ``width`` registers, taken as the fastest core's FLOP/s over ``flops_per_cycle`` (float32);
    None where no executable page can be made."""
    loop = executable(bytes.fromhex(FMA_LOOP[width]))
    if loop is None:
        return None
    best: dict[int, float] = {}  # cpu -> fewest seconds an iteration took

    def on(cpu: int) -> None:  # ctypes lets go of the GIL: the cores run at once
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {cpu})  # this thread only
        best[cpu] = seconds_per_iteration(loop)

    threads = [threading.Thread(target=on, args=(cpu,)) for cpu in cpus]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return FMAS * LANES[width] * 2 / min(best.values()) / flops_per_cycle / 1e9


def executable(code: bytes) -> Callable[[int], None] | None:
    """``code``, a function of one 64-bit integer (System V calling convention), callable from an
    executable page of its own; None where the system allows none (W^X: SELinux's execmem denied, PaX)."""
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError):
        return None
    page.write(code)
    function = ctypes.CFUNCTYPE(None, ctypes.c_int64)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    function.page = page  # mapped while the function lives
    return function


def seconds_per_iteration(loop: Callable[[int], None], budget: float = BUDGET_S) -> float:
    """The fewest seconds an iteration of ``loop(n)`` took, over rounds of about ``ROUND_S`` for
    ``budget`` seconds (the first ones while the core's clock rises)."""
    n, fastest, end = 10_000, float("inf"), time.perf_counter() + budget
    while time.perf_counter() < end:
        start = time.perf_counter()
        loop(n)
        fastest = min(fastest, (time.perf_counter() - start) / n)
        n = max(1_000, int(ROUND_S / fastest))
    return fastest


def keep_best(path: Path, key: str, value: float) -> float:
    """The highest of ``value`` and what the JSON file ``path`` holds under ``key``, written back
    (atomically) when ``value`` is higher."""
    cache = json.loads(path.read_text()) if path.exists() else {}
    best = max(cache.get(key, 0.0), value)
    if best != cache.get(key):
        cache[key] = best
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        tmp.replace(path)
    return float(best)
