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

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

COLLECTIVE = re.compile(r"=\s*(\(?[^=]*?\)?)\s+(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                        r"(?:-start)?\((.*)$")
SHAPE = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64|f8e4m3fn|f8e5m2)\[([\d,]*)\]")
INDEX = re.compile(r"/\*index=\d+\*/")  # HLO's tuple-element comments (their "=" would end a result's match)
CALL = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
BOUND = re.compile(r"= s(?:32|64)\[\]\S* constant\((\d+)\)")
ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
            "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def _bytes(text: str) -> int:
    """Bytes of every array shape written in ``text`` (``bf16[8,128]`` -> 2048)."""
    return sum(ITEMSIZE[dtype] * math.prod(int(d) for d in dims.split(",") if d) for dtype, dims in SHAPE.findall(text))


def collective_bytes(hlo: str) -> int:
    """Bytes one device sends in the collectives of compiled HLO text ``hlo``, each counted as
    often as it runs: a computation runs once per run of each instruction that calls it, and a
    ``while`` body (the micro-batch loop, a scan over layers, one inside the other) once per
    iteration: XLA's ``known_trip_count``, else (TPU HLO) the bound its condition compares a
    counter against (``i < N``, as a scan or fori_loop lowers), else once."""
    sent: dict[str, int] = {}  # computation -> bytes its own collectives send, each run
    # computation -> (callee, the condition of the loop it is the body or condition of, XLA's trip count)
    calls: dict[str, list[tuple[str, str | None, int | None]]] = {}
    bounds: dict[str, list[int]] = {}  # computation -> the integer constants of an `i < N` condition
    entry = current = None
    for line in INDEX.sub("", hlo).splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):  # a computation's header
            head = line.split()
            current = head[int(head[0] == "ENTRY")].lstrip("%")
            entry = current if head[0] == "ENTRY" else entry
            sent[current], calls[current], bounds[current] = 0, [], []
            continue
        if current is None:
            continue
        bounds[current] += [int(n) for n in BOUND.findall(line)]
        if "direction=LT" not in line and " compare(" in line:
            bounds[current].append(-1)  # another comparison: no plain `i < N`
        called = CALL.findall(line)
        trips = TRIP_COUNT.search(line)
        condition = dict(called).get("condition")  # a while's: its body and condition run once per iteration
        for kind, callee in called:
            loop = kind in ("body", "condition")
            calls[current].append((callee, condition if loop else None, int(trips.group(1)) if loop and trips else None))
        for group in BRANCHES.findall(line):
            calls[current] += [(callee.strip().lstrip("%"), None, None) for callee in group.split(",")]
        match = COLLECTIVE.search(line)
        if match and "-done(" not in line:
            result, op, operands = match.group(1), match.group(2), match.group(3).split("), ")[0]
            size = max(_bytes(result), _bytes(operands))
            sent[current] += 2 * size if op == "all-reduce" else size
    runs = dict.fromkeys(sent, 0)
    runs[entry] = 1
    for caller in reversed(list(sent)):  # HLO text lists callees before their callers, the entry last
        for callee, condition, known in calls[caller]:
            bound = bounds.get(condition, []) if condition else []
            times = known or (bound[0] if len(bound) == 1 and bound[0] > 0 else 1)
            runs[callee] = runs.get(callee, 0) + runs[caller] * times
    return sum(sent[name] * runs[name] for name in sent)


@dataclass(frozen=True)
class Prediction:
    """The roofline's terms (seconds per step, one device) and what they imply."""

    compute_s: float
    memory_s: float
    collective_s: float
    bytes_source: str  # "XLA" or "estimated"
    xla_optimal_s: float | None  # XLA's own estimate, where positive
    sent: int = 0  # bytes one device sends in collectives per step

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
                      optimal * loop_trips if np.isfinite(optimal) and optimal > 0 else None, sent)
