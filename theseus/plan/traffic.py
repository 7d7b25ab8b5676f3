"""Where a compiled step's HBM bytes go: each instruction of the program's own sequence (a
fusion, a matrix product, a kernel, a copy) reads its operands and writes its result through
HBM once each time it runs, and the parts of the model they belong to, by the name scopes
JAX records in their metadata, are summed.

An operand a fusion reads only through a slice or gather counts the elements it takes; a buffer
updated in place (``dynamic-update-slice``: a scanned layer's slot of its stacked activations,
a loop's slot of its outputs) counts the update read and written, not the buffer; arrays
a TPU lays out in VMEM (memory space 1) count nothing; an asynchronous copy or slice (XLA's
prefetches of weights and activations to and from VMEM) counts what it moves, once. XLA's own
``bytes accessed`` counts such a copy's operand again in its result and at its ``-done``: on a
TPU it is the larger total.

Parts are named for a reader: the logits (the output head's product and the cross-entropy),
the attention's scores and values (a kernel such as splash, or written out), its projections,
the MLP, norms, embeddings, the optimizer update, collectives, the async copies; any other
by the model's module path (``h/moe``), layers merged.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from theseus.model.layers import ATTENTION_SCORES
from theseus.model.models.gpt import OUTPUT_HEAD
from theseus.plan.hlo import COLLECTIVES, Instruction, Program, shape_bytes
from theseus.tasks.token_logps import CROSS_ENTROPY
from theseus.training.step import OPTIMIZER_UPDATE

MOVES_NOTHING = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "call", "conditional",
                 "after-all", "partition-id", "replica-id", "opt-barrier"}
ASYNC_COPIES = {"copy-start", "slice-start"}  # result: (source, destination, context)
PARTIAL = {"slice", "dynamic-slice", "gather"}  # a fusion parameter read only through these reads what they take
IN_PLACE = "dynamic-update-slice"  # its operand 0, the buffer, is updated where it lies: neither read nor written
# name-stack components that are no module or scope: JAX's and Flax's functions, loops, an einsum
NOT_MODULES = re.compile(r"^(_.*|train_step|core_fn|while|body|cond|closed_call|checkpoint|remat|rematted_computation"
                         r"|[A-Z].*|.*(->|,).*)$")  # [A-Z]: the model's class (a module's name is its attribute's)
PARTS = (  # (the names a module path holds one of, the part's name), the first match
    ((OUTPUT_HEAD, "wte.attend", "lm_head"), "logits: output head"), ((CROSS_ENTROPY,), "logits: cross-entropy"),
    ((ATTENTION_SCORES,), "attention scores and values"), (("attn",), "attention projections"), (("mlp",), "MLP"),
    ((OPTIMIZER_UPDATE,), "optimizer update"), (("wte", "wpe"), "embeddings"))


def module_path(op_name: str) -> tuple[str, ...]:
    """``jit(train_step)/while/body/transpose(jvp(GPT))/jit(core_fn)/h_3/mlp/ad,fd->af/dot_general``
    -> ``("h", "mlp")``: the modules and name scopes (a scope inside a transformation, as
    ``jvp(cross_entropy)``, unwrapped), layers' indices dropped, the primitive too."""
    names = (re.sub(r"^(\w+\()+|\)+$", "", part) for part in op_name.split("/")[:-1])
    return tuple(re.sub(r"_\d+$", "", name) for name in names if name and not NOT_MODULES.match(name))


def part_of(instruction: Instruction, producers: dict[str, str]) -> str:
    """The part of the step ``instruction`` belongs to (see the module's docstring); one without
    metadata (a layout copy XLA adds) is its first operand's (``producers``: name -> part)."""
    if instruction.opcode.removesuffix("-start") in COLLECTIVES:
        return "collectives"
    if "splash" in instruction.name:  # a Pallas kernel's custom call keeps no metadata
        return "attention scores and values"
    if not instruction.op_name and instruction.opcode in ASYNC_COPIES:
        return "async copies to and from VMEM"
    if not instruction.op_name and instruction.operands:
        return producers.get(instruction.operands[0], "other")
    path = module_path(instruction.op_name)
    for names, part in PARTS:
        if any(name in path for name in names):
            return part
    if any(name.startswith("ln") or name.endswith("norm") for name in path):
        return "norms"
    if path == ("h",):  # a block's own: its residual adds
        return "residual stream"
    return "/".join(path) or "other"


def partial_reads(program: Program) -> dict[str, dict[int, int]]:
    """Fused computation -> {parameter index: bytes read} for each parameter it reads only
    through slices or gathers (their results' bytes) or updates in place (nothing)."""
    reads = {}
    for name, instructions in program.computations.items():
        parameters = {i.name: int(i.arguments) for i in instructions if i.opcode == "parameter"}
        users: dict[str, list[tuple[str, int, int]]] = {}
        for i in instructions:
            for position, operand in enumerate(i.operands):
                if operand in parameters:
                    size = 0 if i.opcode == IN_PLACE else shape_bytes(i.result)
                    users.setdefault(operand, []).append((i.opcode, position, size))
        reads[name] = {parameters[p]: sum(size for *_, size in used) for p, used in users.items()
                       if all(opcode in (*PARTIAL, IN_PLACE) and position == 0 for opcode, position, _ in used)}
    return reads


def in_place_writes(program: Program, types: dict[str, str]) -> dict[str, int]:
    """Fused computation -> the HBM bytes its result writes, for one whose root (or a root tuple's
    element) updates a buffer in place: that update's bytes, where the buffer's would be
    (``types``: ``program.types()``)."""
    writes = {}
    for name, instructions in program.computations.items():
        if not instructions:
            continue
        by_name, root = {i.name: i for i in instructions}, instructions[-1]  # HLO prints the ROOT last
        elements = [by_name.get(operand) for operand in root.operands] if root.opcode == "tuple" else [root]
        if any(e is not None and e.opcode == IN_PLACE for e in elements):
            writes[name] = sum(shape_bytes(types.get(e.operands[1], ""), hbm_only=True) if e.opcode == IN_PLACE
                               else shape_bytes(e.result, hbm_only=True) for e in elements if e is not None)
    return writes


def instruction_bytes(instruction: Instruction, types: dict[str, str], partial: dict[str, dict[int, int]],
                      writes: dict[str, int]) -> int:
    """HBM bytes one run of ``instruction`` moves: its operands read, its result written (an
    in-place update: the update's bytes; ``writes``: a fusion's, by ``in_place_writes``)."""
    opcode = instruction.opcode
    if opcode in MOVES_NOTHING or opcode.endswith("-done"):
        return 0
    if opcode == IN_PLACE:
        update = shape_bytes(types.get(instruction.operands[1], ""), hbm_only=True)
        indices = sum(shape_bytes(types.get(name, ""), hbm_only=True) for name in instruction.operands[2:])
        return 2 * update + indices
    if opcode in ASYNC_COPIES:
        moved = instruction.result_elements()[1]
        source_in_hbm = any(shape_bytes(types.get(name, ""), hbm_only=True) for name in instruction.operands)
        return shape_bytes(moved) * source_in_hbm + shape_bytes(moved, hbm_only=True)
    called = re.search(r"calls=%?([\w.\-]+)", instruction.attributes)
    sliced = partial.get(called.group(1), {}) if opcode == "fusion" and called else {}
    reads = sum(sliced.get(i, shape_bytes(types.get(name, ""), hbm_only=True))
                for i, name in enumerate(instruction.operands))
    written = writes.get(called.group(1)) if opcode == "fusion" and called else None
    return (shape_bytes(instruction.result, hbm_only=True) if written is None else written) + reads


def moves(program: Program) -> Iterator[tuple[Instruction, int, int]]:
    """Each instruction of ``program``'s own sequence (``control_only``: no kernel's body), how
    many times it runs, and the HBM bytes one run of it moves (``instruction_bytes``)."""
    types = program.types()
    partial, writes = partial_reads(program), in_place_writes(program, types)
    for instruction, times in program.instructions(control_only=True):
        yield instruction, times, instruction_bytes(instruction, types, partial, writes)


def hbm_bytes_by_part(hlo: str) -> Counter:
    """Part -> the HBM bytes its instructions move in one run of compiled HLO text ``hlo`` (one
    device's program), each as often as it runs (loops' trips)."""
    parts: Counter = Counter()
    producers: dict[str, str] = {}
    for instruction, times, moved in moves(Program.parse(hlo)):
        producers[instruction.name] = part = part_of(instruction, producers)
        parts[part] += moved * times
    return +parts
