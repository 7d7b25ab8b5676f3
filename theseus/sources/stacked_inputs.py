"""Checkpoints saved with the MLP's input projections stacked, read in today's layout.

Until 2026-12-06 an MLP's input projections (and an MoE's experts') were one weight stacked on
an ``n_in`` axis, gate first: ``w_in: [(layers,) n_in, (expert,) d_model, hidden]``, ``b_in:
[(layers,) n_in, hidden]``. Each is now a weight of its own (``w_gate``, ``w_up``; ``b_gate``,
``b_up``; GELU's one is ``up``). A checkpoint in the stacked layout is restored as it was saved,
onto targets stacked from today's (``as_saved``), and split after (``as_today``): the params and
every optimizer-state tree that mirrors them, so that a run resumes, and its weights start or
sample, across the change.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

STACKED = {"w_in": "w", "b_in": "b"}  # the stacked parameter -> the prefix of today's


def holds_stacked(layout: Any) -> bool:
    """Whether a saved train state's (or params') layout stacks the input projections."""
    return any(_names(path)[-1] in STACKED for path, _ in jax.tree_util.tree_flatten_with_path(layout)[0])


def as_today(tree: Any) -> Any:
    """``tree`` (a state or params, stacked) with each stacked weight split into today's: arrays
    sliced, shapes (orbax's metadata or ShapeDtypeStructs) cut."""
    widths = {leaf.shape[_axis(path)] for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
              if _names(path)[-1] == "w_in" and hasattr(leaf, "shape")}
    names = ("gate", "up")[2 - max(widths, default=2):]  # one activation, one width: an optimizer's masked leaves too

    def split(path, node):
        if not _stacked(node):
            return node
        axis, out = _axis(path), {key: value for key, value in node.items() if key not in STACKED}
        for old, prefix in STACKED.items():
            if old in node:
                out.update({f"{prefix}_{name}": _slice(node[old], i, axis) for i, name in enumerate(names)})
        return out

    return jax.tree_util.tree_map_with_path(split, tree, is_leaf=_stacked)


def as_saved(tree: Any) -> Any:
    """``tree`` (abstract: ShapeDtypeStructs with shardings, in today's layout) with the input
    projections stacked as the checkpoint holds them: a restore target."""
    def stack(path, node):
        if not _today(node):
            return node
        axis = _axis(path)
        names = [name for name in ("gate", "up") if f"w_{name}" in node]
        out = {key: value for key, value in node.items() if key not in {f"{p}_{n}" for p in "wb" for n in names}}
        for old, prefix in STACKED.items():
            parts = [node[f"{prefix}_{name}"] for name in names if f"{prefix}_{name}" in node]
            if parts:
                out[old] = _stacked_leaf(parts, axis)
        return out

    return jax.tree_util.tree_map_with_path(stack, tree, is_leaf=_today)


def _stacked(node: Any) -> bool:
    return isinstance(node, dict) and "w_in" in node


def _today(node: Any) -> bool:
    return isinstance(node, dict) and "w_up" in node and "w_out" in node


def _names(path: tuple) -> list[str]:
    """``path``'s keys: ``["params", "h_0", "mlp", "w_in"]``."""
    return jax.tree_util.keystr(path, simple=True, separator="/").split("/")


def _axis(path: tuple) -> int:
    """The stacked axis: the first, or the second in scanned blocks (``h``: layers first)."""
    return 1 if "h" in _names(path) else 0


def _slice(leaf: Any, i: int, axis: int) -> Any:
    if isinstance(leaf, jax.Array):
        return leaf[(slice(None),) * axis + (i,)]
    if not hasattr(leaf, "shape"):  # an optimizer state's masked leaf
        return leaf
    return jax.ShapeDtypeStruct(leaf.shape[:axis] + leaf.shape[axis + 1:], leaf.dtype)


def _stacked_leaf(parts: list, axis: int) -> Any:
    first = parts[0]
    if not hasattr(first, "shape"):  # an optimizer state's masked leaf
        return first
    sharding = first.sharding
    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (len(first.shape) - len(sharding.spec))
        sharding = NamedSharding(sharding.mesh, PartitionSpec(*spec[:axis], None, *spec[axis:]))
    return jax.ShapeDtypeStruct((*first.shape[:axis], len(parts), *first.shape[axis:]), first.dtype, sharding=sharding)
