"""A predicted step time for a step compiled for hardware it has not run on: each instruction's
roofline, summed.

A device runs its program's instructions one after another (a TPU core's one sequence; a GPU's
one stream). Each run of an instruction takes the longer of its matrix products at the chip's
matrix rate and its HBM bytes at the chip's bandwidth; the step is the sum over the program's
sequence (``traffic.moves``: each loop's body as often as it trips), plus its collectives.

- Products (``theseus.plan.products``): FLOPs from the shapes in the HLO, each over the share of
  the matrix unit it fills (a 128-wide MXU runs 64 head dimensions at half its rate). The rate
  is the chip's own measured one where there is one (``MATRIX_RATE``), else its datasheet peak.
- Bytes (``theseus.plan.traffic``): what each instruction reads and writes through HBM; an
  asynchronous copy to or from VMEM counts its bytes as an instruction of its own (it shares
  the bandwidth with the instructions it overlaps).
- Kernels: XLA sees no products inside a Pallas kernel's custom call. The FLOPs of the step's
  count that the program's products do not hold are the attention kernels' (theseus counts 6
  products a (query, key) pair: 2 forward, 4 backward); splash's kernels run 2 (forward), 3
  (dq) and 4 (dkv) of them, the scores recomputed in both backward kernels (one kernel of 5
  where the backward is fused: ``architecture.splash_fused_backward``), and fill the unit
  by their head dimension. Each step of a kernel's grid (batch x heads x query blocks x key
  blocks, the blocks its mask skips too) costs ``KERNEL_STEP_S`` besides.
- Collectives: all-reduce sends about twice its buffer, the others about their larger side, at
  the interconnect's bandwidth, not overlapped with compute (an upper bound where XLA overlaps
  them), each counted once per iteration of the loops it is in.

What it is not: a simulator. It does not overlap one instruction with the next, nor model an
instruction's pipeline start, its vector-unit work (softmax, norms: counted by their bytes only) or
a product's tiling beyond the unit's width; it knows no other kernel than splash's FLOPs (another
custom call costs its bytes). One constant is fitted, to a kernel's programs rather than to any
step: ``KERNEL_STEP_S``. Against one TPU v5e chip (2026-12-07, JAX 0.10.2,
``benchmarks/accelerator.py``) it came within 1% of the chip's step for GPT-2 small (batch 16,
splash's backward fused or not) and within 2% for SmolLM2-135M (batch 8, fused), 4-12% under it for
~10M-parameter models, whose steps are ~1,500 instructions of a few microseconds each (no fixed
cost an instruction is modelled). It puts splash's gradient, timed alone, from 5% over to 22% under
the chip, the fused kernel furthest under (the fit below runs the kernels' products at 51 TFLOP/s,
not the 83.5 a half-filled unit would): within a whole step that error does not show, so something
else there is counted high by about as much; which, is not found. Without the unit's padding and
the kernels' grid steps it was 28-47% under; with max(FLOPs at peak, XLA's bytes), 38% under to 71%
over.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from theseus.model.splash import block_size
from theseus.plan.hlo import COLLECTIVES, Instruction, Program, shape_bytes, shape_dims
from theseus.plan.products import ProductCounter, Products, share
from theseus.plan.traffic import MOVES_NOTHING, moves

# A matrix product's rate where the chip's own measurement says so: an 8192^3 bfloat16 product
# timed on one TPU v5e chip (JAX 0.10.2, 2026-12-07) ran at 167 of its 197 TFLOP/s datasheet peak.
MATRIX_RATE = {"TPU v5e": 167e12}
# The side of a chip's systolic matrix units (Google's TPU architecture pages: 128 x 128 MXUs
# through v5p, 256 x 256 from v6e); none on a GPU (its tensor cores take small tiles).
MATRIX_WIDTH = {"TPU v2": 128, "TPU v3": 128, "TPU v4": 128, "TPU v5e": 128, "TPU v5p": 128, "TPU v6e": 256,
                "TPU7x": 256}
# The fixed cost of one step of a Pallas TPU kernel's grid (its DMAs issued and awaited, its
# loop's bookkeeping), measured: splash's gradient at GPT-2 small's attention (batch 16, 12 heads,
# 1024 positions, head_dim 64) on one TPU v5e chip, at blocks of 1024, 512, 256 and 128, its
# backward fused and not (8 programs, 384 to 36,864 grid steps, 3.5 to 17.5 ms); seconds fitted as
# products at a rate plus grid steps at a cost: 0.44 us a step (``benchmarks/accelerator.py
# --sections attention``). Without it GPT-2 small's step came 9% under the chip's, SmolLM2's 17%.
KERNEL_STEP_S = 0.44e-6
SPLASH = {"splash_mha_dkv": 4, "splash_mha_dq": 3, "splash_mha_fwd": 2}  # kernel -> products a (query, key) pair
COUNTED = 6  # products a pair in theseus's FLOPs count: QK^T and PV forward, 4 backward (layers.Attention.flops)
BACKWARD = "splash_mha_dkv"  # one run a layer's backward: the count's 6 products are one run's
DQ = "splash_mha_dq"  # absent where the backward is fused: the dkv kernel computes dq
FUSED_BACKWARD = 5  # products a pair of the dkv kernel that computes dq too (architecture.splash_fused_backward)


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
class Hardware:
    """What the sum needs of one device: its matrix ``rate`` (FLOP/s), its matrix unit's ``width``
    (None: no padding), its HBM ``bandwidth`` and its ``interconnect`` (bytes/s)."""

    rate: float
    width: int | None
    bandwidth: float
    interconnect: float

    @classmethod
    def of(cls, chip: str, *, peak: float, bandwidth: float, interconnect: float, per_chip: int = 1) -> Hardware:
        """A device of ``chip`` (``theseus.base.hardware.Chip.name``) at ``peak`` FLOP/s, or at the
        chip's measured rate where tabled (``per_chip``: devices a chip, as libtpu shows v4's two
        TensorCores)."""
        rate = MATRIX_RATE[chip] / per_chip if chip in MATRIX_RATE else peak
        return cls(rate, MATRIX_WIDTH.get(chip), bandwidth, interconnect)


@dataclass(frozen=True)
class Prediction:
    """The step's time (seconds, one device) by what bounds each instruction, and its totals."""

    compute_s: float  # instructions whose products outlast their bytes
    memory_s: float  # instructions whose bytes outlast their products
    kernel_steps_s: float  # Pallas kernels' grid steps at KERNEL_STEP_S
    collective_s: float
    flops: float  # the products' FLOPs (kernels' included)
    accessed: float  # the HBM bytes its instructions move
    rate: float  # FLOP/s of the products
    sent: int = 0  # bytes one device sends in collectives per step
    kernel_steps: int = 0
    xla_optimal_s: float | None = None  # XLA's own estimate, where positive

    @property
    def step_s(self) -> float:
        return self.compute_s + self.memory_s + self.kernel_steps_s + self.collective_s

    @property
    def bound(self) -> str:
        terms = {"compute": self.compute_s, "memory": self.memory_s, "kernel-step": self.kernel_steps_s,
                 "collectives": self.collective_s}
        return max(terms, key=terms.get)


def _kernel(instruction: Instruction) -> str | None:
    """Which of splash's kernels ``instruction`` calls, or None."""
    if instruction.opcode != "custom-call":
        return None
    return next((kernel for kernel in SPLASH if instruction.name.startswith(kernel)), None)


def _kernel_shape(instruction: Instruction, types: dict[str, str]) -> list[int]:
    """A splash kernel's query shape ``[batch, heads, seq, head_dim]``: its largest operand of four
    dimensions (the others: keys and values, and the mask's block maps and segment ids)."""
    shapes = [shape_dims(types.get(name, "")) for name in instruction.operands]
    return max((shape for shape in shapes if len(shape) == 4), key=math.prod)


def _kernel_steps(shape: list[int]) -> int:
    """The grid steps of one run of a splash kernel over queries of ``shape``: every pair of blocks."""
    batch, heads, seq, _ = shape
    return batch * heads * (seq // (block_size(seq) or seq)) ** 2


def instruction_times(program: Program, hardware: Hardware,
                      flops: float) -> Iterator[tuple[int, float, float, int, Products]]:
    """Each instruction's (times it runs, and for one run: its products' seconds, its bytes'
    seconds, its kernel's grid steps, its products); ``flops``: the step's count on one device,
    the kernels' share of it what the program's products do not hold."""
    count, types = ProductCounter(program, hardware.width), program.types()
    runs = [(i, times, moved, count(i), _kernel(i)) for i, times, moved in moves(program)
            if i.opcode not in MOVES_NOTHING and not i.opcode.endswith("-done")]
    seen = sum(p.flops * times for _, times, _, p, _ in runs)
    layers = sum(times for _, times, _, _, kernel in runs if kernel == BACKWARD)
    fused = DQ not in {kernel for *_, kernel in runs}
    per_product = max(flops - seen, 0.0) / (COUNTED * layers) if layers else 0.0  # FLOPs of one product, one layer
    for instruction, times, moved, products, kernel in runs:
        steps = 0
        if kernel:
            shape = _kernel_shape(instruction, types)
            done = (FUSED_BACKWARD if fused and kernel == BACKWARD else SPLASH[kernel]) * per_product
            products, steps = Products(done, done / share(shape[-1], hardware.width)), _kernel_steps(shape)
        yield times, products.filled / hardware.rate, moved / hardware.bandwidth, steps, products


def predict(compiled: Any, hardware: Hardware, *, flops_per_device: float, loop_trips: int = 1) -> Prediction:
    """The summed rooflines of ``compiled`` (one device's program) on ``hardware``, ``flops_per_device``
    its step's FLOPs count on one device (theseus's: the kernels' too); ``loop_trips`` scales
    XLA's own estimate, which counts a loop's body once (``trainer.grad_accum``)."""
    hlo = compiled.as_text()
    compute = memory = flops = accessed = 0.0
    steps = 0
    for times, products_s, bytes_s, kernel_steps, products in instruction_times(Program.parse(hlo), hardware,
                                                                               flops_per_device):
        compute += times * products_s if products_s >= bytes_s else 0.0
        memory += times * bytes_s if bytes_s > products_s else 0.0
        flops, accessed = flops + times * products.flops, accessed + times * bytes_s * hardware.bandwidth
        steps += times * kernel_steps
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    optimal = float(cost.get("optimal_seconds", -1.0)) * loop_trips
    sent = collective_bytes(hlo)
    return Prediction(compute, memory, steps * KERNEL_STEP_S, sent / hardware.interconnect, flops, accessed,
                      hardware.rate, sent, steps, optimal if np.isfinite(optimal) and optimal > 0 else None)
