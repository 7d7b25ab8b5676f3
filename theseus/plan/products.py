"""The matrix products of a compiled program: their FLOPs from the shapes in its HLO, and how
much of a systolic matrix unit each fills.

A ``dot`` multiplies ``2 x result x contracted`` (its ``lhs_contracting_dims``); a ``convolution``
(XLA's TPU backend writes most products, per-head ones and weights' gradients among them, as
convolutions) ``2 x batch x output features x input features`` for each position of its window
that lands inside its input (padding counted out), as XLA's own cost analysis counts them. A
fusion holds the products of the computation it calls.

A matrix unit ``width`` wide (a TPU's MXU: 128 x 128 on v2-v5, 256 x 256 on v6e) takes a product's
contracted and output dimensions in tiles of that width: a product of 64 head dimensions fills
half of a 128-wide unit and takes as long as one of 128 (its ``share`` of the unit is 1/2).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from theseus.plan.hlo import Instruction, Program, shape_dims

CALLS = re.compile(r"calls=%?([\w.\-]+)")
CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
LABELS = re.compile(r"dim_labels=([\w]+)_([\w]+)->([\w]+)")
WINDOW = re.compile(r"window=\{([^}]*)\}")


@dataclass(frozen=True)
class Products:
    """The FLOPs of some matrix products, and those FLOPs over the share of the unit each fills
    (``filled``: the FLOPs a unit of that width runs in the same time, padding included)."""

    flops: float = 0.0
    filled: float = 0.0

    def __add__(self, other: Products) -> Products:
        return Products(self.flops + other.flops, self.filled + other.filled)


def share(size: int, width: int | None) -> float:
    """The share of a ``width``-wide matrix unit that a dimension of ``size`` fills, its last tile
    padded (64 of 128: 0.5; 576 of 640: 0.9); 1 without a width (a GPU's tensor cores: small tiles)."""
    return 1.0 if not width else size / (math.ceil(size / width) * width)


def _window(attributes: str, field: str, rank: int, default: tuple[int, ...]) -> list[tuple[int, ...]]:
    """One field of a convolution's ``window={size=1x12 pad=0_0x11_11 ...}``, per spatial dimension."""
    window = WINDOW.search(attributes)
    found = re.search(rf"\b{field}=(\S+)", window.group(1)) if window else None
    if not found:
        return [default] * rank
    return [tuple(int(n) for n in part.split("_")) for part in found.group(1).split("x")]


def _taps(n_in: int, n_out: int, size: int, stride: int, low: int, lhs_dilation: int, rhs_dilation: int) -> int:
    """(output position, window position) pairs of one spatial dimension that read the input, not its padding."""
    return sum(1 for o in range(n_out) for j in range(size)
               if (x := o * stride + j * rhs_dilation - low) >= 0 and x % lhs_dilation == 0
               and x // lhs_dilation < n_in)


def convolution(instruction: Instruction, types: dict[str, str], width: int | None) -> Products:
    """A convolution's FLOPs and filled FLOPs (``types``: operand name -> its type)."""
    lhs, rhs = (shape_dims(types.get(name, "")) for name in instruction.operands[:2])
    out = shape_dims(instruction.result)
    lhs_labels, rhs_labels, out_labels = LABELS.search(instruction.attributes).groups()
    spatial = sum(label.isdigit() for label in lhs_labels)
    sizes, strides = _window(instruction.attributes, "size", spatial, (1,)), _window(
        instruction.attributes, "stride", spatial, (1,))
    pads = _window(instruction.attributes, "pad", spatial, (0, 0))
    lhs_dilations = _window(instruction.attributes, "lhs_dilate", spatial, (1,))
    rhs_dilations = _window(instruction.attributes, "rhs_dilate", spatial, (1,))
    taps = math.prod(_taps(lhs[lhs_labels.index(str(d))], out[out_labels.index(str(d))], sizes[d][0], strides[d][0],
                           pads[d][0], lhs_dilations[d][0], rhs_dilations[d][0]) for d in range(spatial))
    inputs, outputs = rhs[rhs_labels.index("i")], rhs[rhs_labels.index("o")]
    flops = 2 * out[out_labels.index("b")] * out[out_labels.index("f")] * inputs * taps
    return Products(flops, flops / (share(inputs, width) * share(outputs, width)))


def dot(instruction: Instruction, types: dict[str, str], width: int | None) -> Products:
    """A dot's FLOPs and filled FLOPs (its contracted dimensions, ``lhs_contracting_dims``, and its
    result's last, the output's, fill the unit)."""
    lhs, out = shape_dims(types.get(instruction.operands[0], "")), shape_dims(instruction.result)
    contracting = CONTRACTING.search(instruction.attributes)
    contracted = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d) if contracting else 1
    flops = 2 * math.prod(out) * contracted
    return Products(flops, flops / (share(contracted, width) * share(out[-1] if out else 1, width)))


class ProductCounter:
    """The products of each instruction of ``program`` (a fusion: those of the computation it
    calls, counted once per computation) on a matrix unit ``width`` wide."""

    def __init__(self, program: Program, width: int | None):
        self.program, self.width, self.types = program, width, program.types()
        self.called: dict[str, Products] = {}

    def __call__(self, instruction: Instruction) -> Products:
        if instruction.opcode == "convolution":
            return convolution(instruction, self.types, self.width)
        if instruction.opcode == "dot":
            return dot(instruction, self.types, self.width)
        called = CALLS.search(instruction.attributes)
        if instruction.opcode != "fusion" or not called:
            return Products()
        name = called.group(1)
        if name not in self.called:
            self.called[name] = sum(map(self, self.program.computations.get(name, [])), Products())
        return self.called[name]
