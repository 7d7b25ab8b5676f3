"""Compiled HLO text, read: its computations, their instructions, and how often each runs.

``Program.parse(compiled.as_text())`` gives every computation's instructions (name, result type,
opcode, operands, the ``op_name`` of their metadata) and ``runs``: how many times each
computation runs in one run of the entry, through the loops around it (XLA's
``known_trip_count``, else, as TPU HLO prints a scan or fori_loop, the ``i < N`` its condition
compares a counter against, else once). The planner's collectives, HBM traffic and step time
(``predict``, ``traffic``) are sums over it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

SHAPE = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64|f8e4m3fn|f8e5m2)\[([\d,]*)\](\{[^}]*\})?")
ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
            "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
INDEX = re.compile(r"/\*index=\d+\*/")  # HLO's tuple-element comments
INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][a-z0-9\-]*)\((.*)$")
LOOP = re.compile(r"\b(body|condition)=%?([\w.\-]+)")
CALLED = re.compile(r"\b(calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
BOUND = re.compile(r"= s(?:32|64)\[\]\S* constant\((\d+)\)")
OP_NAME = re.compile(r'op_name="([^"]*)"')
# what runs a computation once per run of its caller as the program's own sequence, not inside
# one kernel (a fusion's body, a reduction's function): what moves data through HBM
CONTROL = {"while", "call", "conditional"}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def shape_bytes(text: str, hbm_only: bool = False) -> int:
    """Bytes of every array shape written in ``text`` (``bf16[8,128]`` -> 2048); ``hbm_only``:
    leaving out those laid out in a TPU's VMEM (memory space 1: ``S(1)`` in their layout)."""
    return sum(ITEMSIZE[dtype] * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims, layout in SHAPE.findall(text) if not (hbm_only and "S(1)" in layout))


def shape_dims(text: str) -> list[int]:
    """The dimensions of the first array shape written in ``text`` (``bf16[8,128]{1,0}`` -> ``[8, 128]``)."""
    found = SHAPE.search(text)
    return [int(d) for d in found.group(2).split(",") if d] if found else []


@dataclass(frozen=True)
class Instruction:
    """One instruction: ``%name = result opcode(arguments), attributes``."""

    name: str
    result: str  # its type as printed: "bf16[16,1024]{1,0}", or a tuple "(f32[4]{0}, s32[])"
    opcode: str
    arguments: str  # between its parentheses: operand names (CPU/GPU HLO prints their types before them)
    attributes: str  # the rest of the line

    @property
    def operands(self) -> list[str]:
        return re.findall(r"%([\w.\-]+)", self.arguments)

    @property
    def op_name(self) -> str:
        """The JAX name stack it came from (``jit(train_step)/.../h_0/mlp/dot_general``), or ""."""
        found = OP_NAME.search(self.attributes)
        return found.group(1) if found else ""

    def result_elements(self) -> list[str]:
        """The result tuple's element types at its top level (one element: the result itself)."""
        text = self.result
        if not text.startswith("("):
            return [text]
        elements, depth, start = [], 0, 1
        for i, char in enumerate(text):
            if char in "({[":
                depth += 1
            elif char in ")}]":
                depth -= 1
            if (depth == 1 and char == ",") or (depth == 0 and char == ")"):
                elements.append(text[start:i].strip())
                start = i + 1
        return elements


def _split_call(rest: str) -> tuple[str, str]:
    """``"a, b), kind=x"`` -> ``("a, b", ", kind=x")``: an instruction's arguments and attributes."""
    depth = 1
    for i, char in enumerate(rest):
        depth += (char == "(") - (char == ")")
        if depth == 0:
            return rest[:i], rest[i + 1:]
    return rest, ""


@dataclass(frozen=True)
class Program:
    """A compiled module: ``computations`` (name -> its instructions, in order) and its ``entry``."""

    computations: dict[str, list[Instruction]]
    entry: str
    loops: dict[str, list[tuple[str, int]]]  # computation -> (callee, times a run of it runs the callee)
    calls: dict[str, list[tuple[str, str]]]  # computation -> (callee, opcode of the calling instruction)

    @classmethod
    def parse(cls, text: str) -> Program:
        computations: dict[str, list[Instruction]] = {}
        bounds: dict[str, list[int]] = {}  # computation -> the integer constants of an `i < N` condition
        pending: list[tuple[str, str, str, int | None]] = []  # (caller, body or condition, its condition, trips)
        calls: dict[str, list[tuple[str, str]]] = {}
        entry = current = ""
        for line in INDEX.sub("", text).splitlines():
            if line and not line[0].isspace() and line.rstrip().endswith("{"):  # a computation's header
                head = line.split()
                current = head[int(head[0] == "ENTRY")].lstrip("%")
                entry = current if head[0] == "ENTRY" else entry
                computations[current], bounds[current], calls[current] = [], [], []
                continue
            match = INSTRUCTION.match(line)
            if not current or not match:
                continue
            name, result, opcode, rest = match.groups()
            arguments, attributes = _split_call(rest)
            computations[current].append(Instruction(name, result, opcode, arguments, attributes))
            bounds[current] += [int(n) for n in BOUND.findall(line)]
            if opcode == "compare" and "direction=LT" not in line:
                bounds[current].append(-1)  # another comparison: no plain `i < N`
            loop = dict(LOOP.findall(attributes))
            trips = TRIP_COUNT.search(attributes)
            for kind, callee in loop.items():
                pending.append((current, callee, loop.get("condition", ""), int(trips.group(1)) if trips else None))
            calls[current] += [(callee, opcode) for _, callee in CALLED.findall(attributes)]
            for group in BRANCHES.findall(attributes):
                calls[current] += [(callee.strip().lstrip("%"), opcode) for callee in group.split(",")]
        loops: dict[str, list[tuple[str, int]]] = {name: [] for name in computations}
        for caller, callee, condition, known in pending:
            bound = bounds.get(condition, [])
            loops[caller].append((callee, known or (bound[0] if len(bound) == 1 and bound[0] > 0 else 1)))
        return cls(computations, entry, loops, calls)

    def runs(self, control_only: bool = False) -> dict[str, int]:
        """How many times each computation runs in one run of the entry: a loop's body and
        condition once per iteration, any other callee once per run of the instruction calling
        it. ``control_only``: only the computations the program steps through itself (loops,
        calls, conditionals' branches), not a kernel's body (a fusion's, a reducer's)."""
        runs = dict.fromkeys(self.computations, 0)
        runs[self.entry] = 1
        for caller in reversed(list(self.computations)):  # HLO lists callees before their callers, the entry last
            edges = self.loops[caller] + [(callee, 1) for callee, opcode in self.calls[caller]
                                          if not control_only or opcode in CONTROL]
            for callee, times in edges:
                runs[callee] = runs.get(callee, 0) + runs[caller] * times
        return runs

    def instructions(self, control_only: bool = False) -> Iterator[tuple[Instruction, int]]:
        """Every instruction of a computation that runs, with how many times it runs."""
        for computation, times in self.runs(control_only).items():
            for instruction in self.computations.get(computation, []) if times else []:
                yield instruction, times

    def types(self) -> dict[str, str]:
        """Each instruction's name -> its result type."""
        return {i.name: i.result for instructions in self.computations.values() for i in instructions}
