"""Throughput metrics (tokens/s, FLOP/s, MFU), XLA's cost and memory analyses, and their
formatting for people."""

from __future__ import annotations

import math
from typing import Any


def throughput(step_time: float, tokens: int, flops: float, peak: float, n_devices: int) -> dict[str, float]:
    """``tokens_per_s``, ``flops_per_s`` and ``mfu`` of one step.

    ``tokens`` and ``flops`` are the whole step's (all devices); ``peak`` is per device, so
    MFU = flops_per_s / (peak x n_devices).
    """
    if not step_time > 0:
        raise ValueError(f"step_time must be positive seconds, got {step_time!r}")
    if not peak > 0 or n_devices < 1:
        raise ValueError(f"peak ({peak!r} FLOP/s) and n_devices ({n_devices!r}) must be positive")
    flops_per_s = flops / step_time
    return {"tokens_per_s": tokens / step_time, "flops_per_s": flops_per_s, "mfu": flops_per_s / (peak * n_devices)}


def xla_flops(compiled: Any) -> float | None:
    """The FLOPs XLA counts in a compiled computation (``jit(f).lower(...).compile()``); None
    when the backend gives no count.

    For a computation partitioned over devices this is one device's program: multiply by
    the devices to compare with a whole-step count. XLA counts a loop body (``lax.scan``,
    ``fori_loop``) once, not once per iteration: a step that scans over layers or
    micro-batches is undercounted by that factor.
    """
    cost = compiled.cost_analysis()
    entries = cost if isinstance(cost, list | tuple) else [cost]  # a list in older JAX versions
    flops = sum(float(entry.get("flops", 0.0)) for entry in entries if entry)
    return flops if flops > 0 else None


def memory_report(compiled: Any) -> dict[str, int]:
    """XLA's memory estimate of a compiled computation, in bytes per device: ``argument``,
    ``output``, ``alias`` (outputs that reuse donated arguments), ``temp``,
    ``generated_code`` and ``total`` (argument + output - alias + temp). Empty when the
    backend gives no analysis."""
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    report = {
        name: int(getattr(stats, f"{name}_size_in_bytes", 0) or 0)
        for name in ("argument", "output", "alias", "temp", "generated_code")
    }
    report["total"] = report["argument"] + report["output"] - report["alias"] + report["temp"]
    return report


_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BINARY = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def format_si(value: float, unit: str = "") -> str:
    """Three significant digits with an SI prefix: ``12.3k``, ``1.23 TFLOP``, ``456 FLOP/s``."""
    if not math.isfinite(value):
        return f"{value}{' ' + unit if unit else ''}"
    scale, prefix = next(((s, p) for s, p in _SI if abs(value) >= s * 0.9995), (1.0, ""))
    number = f"{value / scale:.3g}"
    return f"{number} {prefix}{unit}" if unit else f"{number}{prefix}"


def format_apart(a: float, b: float, digits: int = 3) -> tuple[str, str]:
    """``a`` and ``b`` with ``digits`` significant digits, or as many more as tell them apart
    (``0.00299973`` and ``0.003``, never ``0.003`` twice), up to the numbers themselves."""
    for d in range(digits, 18):
        texts = f"{a:.{d}g}", f"{b:.{d}g}"
        if texts[0] != texts[1]:
            break
    return texts


def format_bytes(n: float) -> str:
    """Binary units, three significant digits: ``512 B``, ``1.5 KiB``, ``3.25 GiB``."""
    scale, unit = next(((s, u) for s, u in _BINARY if abs(n) >= s * 0.999 * 1000 / 1024), (1, "B"))
    return f"{n / scale:.3g} {unit}"


def format_duration(seconds: float) -> str:
    """``42s``, ``1m23s``, ``2h05m``, ``3d04h``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
