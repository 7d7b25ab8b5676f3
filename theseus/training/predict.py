"""A predicted step time for a step compiled for hardware it has not run on: a roofline.

Per device, the step takes the longer of its FLOPs at the chip's peak and its memory traffic
at the HBM bandwidth, plus its collectives at the interconnect's bandwidth (not overlapped
with compute: an upper bound where XLA overlaps them). Memory traffic is XLA's ``bytes
accessed`` where the backend counts it, else the least the step can move: its arguments and
outputs once, its temporaries written and read. Collectives are read from the compiled HLO:
all-reduce sends about twice its buffer, the others about their larger side; collectives
inside a loop (the micro-batches of ``trainer.grad_accum``) count once per micro-batch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

COLLECTIVE = re.compile(r"=\s*(\(?[^=]*?\)?)\s+(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                        r"(?:-start)?\((.*)$")
SHAPE = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64|f8e4m3fn|f8e5m2)\[([\d,]*)\]")
ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
            "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def _bytes(text: str) -> int:
    """Bytes of every array shape written in ``text`` (``bf16[8,128]`` -> 2048)."""
    return sum(ITEMSIZE[dtype] * math.prod(int(d) for d in dims.split(",") if d) for dtype, dims in SHAPE.findall(text))


def collective_bytes(hlo: str, loop_trips: int = 1) -> int:
    """Bytes one device sends in the collectives of compiled HLO text ``hlo``; those outside the
    entry computation (loop bodies) count ``loop_trips`` times."""
    total, in_entry = 0, False
    for line in hlo.splitlines():
        if line and not line[0].isspace():  # a computation's header
            in_entry = line.startswith("ENTRY")
        match = COLLECTIVE.search(line)
        if not match or "-done(" in line:
            continue
        result, op, operands = match.group(1), match.group(2), match.group(3).split("), ")[0]
        size = max(_bytes(result), _bytes(operands))
        sent = 2 * size if op == "all-reduce" else size
        total += sent * (1 if in_entry else loop_trips)
    return total


@dataclass(frozen=True)
class Prediction:
    """The roofline's terms (seconds per step, one device) and what they imply."""

    compute_s: float
    memory_s: float
    collective_s: float
    bytes_source: str  # "XLA" or "estimated"
    xla_optimal_s: float | None  # XLA's own estimate, where positive

    @property
    def step_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.collective_s

    @property
    def bound(self) -> str:
        terms = {"compute": self.compute_s, "memory": self.memory_s, "collectives": self.collective_s}
        return max(terms, key=terms.get)


def predict(compiled: Any, *, flops_per_device: float, peak: float, hbm_bandwidth: float, interconnect: float,
            memory: dict[str, int], loop_trips: int) -> Prediction:
    """The roofline of ``compiled`` (one device's program) doing ``flops_per_device`` at ``peak``
    FLOP/s, with ``hbm_bandwidth`` and ``interconnect`` in bytes/s."""
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    accessed = float(cost.get("bytes accessed", 0.0)) * loop_trips
    source = "XLA"
    if accessed <= 0:
        accessed = memory["argument"] + memory["output"] - memory["alias"] + 2 * memory["temp"]
        source = "estimated"
    optimal = float(cost.get("optimal_seconds", -1.0))
    sent = collective_bytes(compiled.as_text(), loop_trips)
    return Prediction(flops_per_device / peak, accessed / hbm_bandwidth, sent / interconnect, source,
                      optimal * loop_trips if np.isfinite(optimal) and optimal > 0 else None)
