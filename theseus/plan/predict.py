"""A predicted step time for a step compiled for hardware it has not run on: a roofline.

Per device, the step takes the longer of its FLOPs at the chip's peak and its memory traffic
at the HBM bandwidth, plus its collectives at the interconnect's bandwidth (not overlapped
with compute: an upper bound where XLA overlaps them). Memory traffic is XLA's ``bytes
accessed`` where the backend counts it, else the least the step can move: its arguments and
outputs once, its temporaries written and read (XLA counts a loop's body once: its count is
scaled by ``trainer.grad_accum``, and is a lower bound with a scan over layers). Collectives
are read from the compiled HLO: all-reduce sends about twice its buffer, the others about
their larger side, each counted once per iteration of the loops it is in (the micro-batches
of ``trainer.grad_accum``, ``architecture.scan_layers``'s scan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from theseus.plan.hlo import Program, shape_bytes

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def collective_bytes(hlo: str) -> int:
    """Bytes one device sends in the collectives of compiled HLO text ``hlo``, each counted as
    often as it runs (``Program.runs``: the micro-batch loop, a scan over layers, one inside the
    other): all-reduce about twice its buffer, the others about their larger side (result, or
    operands where their types are printed); an asynchronous one at its ``-start``."""
    sent = 0
    for instruction, times in Program.parse(hlo).instructions():
        op = instruction.opcode.removesuffix("-start")
        if op in COLLECTIVES:
            size = max(shape_bytes(instruction.result), shape_bytes(instruction.arguments))  # CPU/GPU print operands'
            sent += (2 * size if op == "all-reduce" else size) * times
    return sent


@dataclass(frozen=True)
class Prediction:
    """The roofline's terms (seconds per step, one device) and what they imply."""

    compute_s: float
    memory_s: float
    collective_s: float
    bytes_source: str  # "XLA" or "estimated"
    xla_optimal_s: float | None  # XLA's own estimate, where positive
    sent: int = 0  # bytes one device sends in collectives per step
    accessed: float = 0.0  # the HBM bytes of memory_s

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
    sent = collective_bytes(compiled.as_text())
    return Prediction(flops_per_device / peak, accessed / hbm_bandwidth, sent / interconnect, source,
                      optimal * loop_trips if np.isfinite(optimal) and optimal > 0 else None, sent, accessed)
