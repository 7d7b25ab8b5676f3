"""Logical axis names and ShardingPlan: how logical axes map onto the device mesh.

Parameters are annotated with logical axes (``("embed", "mlp")``); a plan maps each logical
axis to mesh axes (``data``, ``fsdp``, ``expert``, ``tensor``, a tuple of them, or None:
replicated).
Keeping the rules apart from the model is MaxText's convention: the model names axes, the
config decides where they live.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec

# Mesh axes.
DATA = "data"
FSDP = "fsdp"
TENSOR = "tensor"
EXPERT = "expert"
# Tensor innermost (the most traffic, the fastest links), experts' all-to-all next to it.
MESH_AXES = (DATA, FSDP, EXPERT, TENSOR)
# The mesh axes a batch is split over. The expert axis carries batch too (as in MaxText): outside
# the mixture-of-experts layers its devices would otherwise repeat each other's work; inside,
# the tokens of its shards are exchanged (all-to-all) so that each device runs its own experts.
BATCH_MESH_AXES = (DATA, FSDP, EXPERT)

# Logical axes of activations and parameters.
BATCH = "batch"  # sequences: split over (data, fsdp, expert)
SEQ = "seq"  # positions within a sequence
VOCAB = "vocab"  # token ids / logits
EMBED = "embed"  # the residual stream, d_model
MLP_HIDDEN = "mlp"  # the hidden width of the feed-forward, d_ff
HEADS = "heads"  # query heads
KV_HEADS = "kv_heads"  # key/value heads (grouped-query attention)
HEAD_DIM = "head_dim"  # features per head
LAYERS = "layers"  # the stacked blocks of architecture.scan_layers (one nn.scan)
EXPERT_AXIS = "expert"  # the experts of a mixture-of-experts layer (weights, dispatched tokens)
EXPERT_BATCH = "expert_batch"  # sequences once dispatched to their experts: the batch less the expert axis
# theseus's own logical axes (a rule of mesh.rules names one of these or one of its model's plan)
LOGICAL_AXES = (BATCH, SEQ, VOCAB, EMBED, MLP_HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, EXPERT_AXIS, EXPERT_BATCH)

MeshAxes = str | tuple[str, ...] | None
LogicalRules = tuple[tuple[str, MeshAxes], ...]  # Flax's logical-axis rules: (logical axis, its mesh axes)


class ShardingPlan(Mapping[str, MeshAxes]):
    """An immutable mapping from logical axis names to mesh axes.

    >>> ShardingPlan(embed="fsdp", mlp="tensor").spec(("embed", "mlp"))
    PartitionSpec('fsdp', 'tensor')
    """

    def __init__(self, rules: Mapping[str, MeshAxes] | None = None, **kwargs: MeshAxes):
        merged = {**(rules or {}), **kwargs}
        for logical, mesh in merged.items():
            for axis in _axes(mesh):
                if axis not in MESH_AXES:
                    raise ValueError(
                        f"sharding rule {logical} -> {mesh!r}: {axis!r} is not a mesh axis "
                        f"(mesh axes: {', '.join(MESH_AXES)})"
                    )
        self._rules = {k: (tuple(v) if isinstance(v, list) else v) for k, v in merged.items()}

    def __getitem__(self, logical: str) -> MeshAxes:
        return self._rules[logical]

    def __iter__(self):
        return iter(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:
        return f"ShardingPlan({self._rules!r})"

    def merge(self, *others: Mapping[str, MeshAxes]) -> ShardingPlan:
        """The union of plans; one logical axis mapped two different ways is an error."""
        rules = dict(self._rules)
        for other in others:
            for logical, mesh in other.items():
                if logical in rules and rules[logical] != mesh:
                    raise ValueError(
                        f"sharding plans conflict on logical axis {logical!r}: "
                        f"{rules[logical]!r} vs {mesh!r}"
                    )
                rules[logical] = mesh
        return ShardingPlan(rules)

    def override(self, rules: Mapping[str, MeshAxes]) -> ShardingPlan:
        """This plan with ``rules`` replacing its entries (config overrides win, no conflict)."""
        return ShardingPlan({**self._rules, **rules})

    def rules(self) -> LogicalRules:
        """Flax logical-axis rules (for ``nn.logical_axis_rules``)."""
        return tuple(self._rules.items())

    def spec(self, logical: Sequence[str | None]) -> PartitionSpec:
        """The PartitionSpec of an array with these logical axes.

        An unknown axis is replicated; a mesh axis already used by an earlier dimension is
        not reused (an array cannot be split twice over one mesh axis).
        """
        used: set[str] = set()
        dims: list[MeshAxes] = []
        for name in logical:
            mesh = self._rules.get(name) if name is not None else None
            axes = tuple(a for a in _axes(mesh) if a not in used)
            used.update(axes)
            dims.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        return PartitionSpec(*dims)

    def specs(self, tree: Any) -> Any:
        """PartitionSpecs for a tree whose leaves are ``nn.Partitioned`` (or logical specs).

        Leaves without logical axes (plain arrays) are replicated.
        """

        def one(leaf: Any) -> PartitionSpec:
            if isinstance(leaf, nn.Partitioned):
                return self.spec(leaf.names)
            if isinstance(leaf, PartitionSpec):
                return self.spec(tuple(leaf))
            return PartitionSpec()

        return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, nn.Partitioned | PartitionSpec))


def gathered_for_use(w: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """Weight ``w`` (logical ``axes``) as a layer computes with it: gathered over the mesh axes
    that split the batch, still split over the others (tensor).

    FSDP splits weights over the batch's mesh axes at rest only (ZeRO-3). Left to itself, XLA
    may keep them split and move the activations instead: on data x fsdp meshes it then
    replicates a [batch, seq, embed] block ("Involuntary full rematerialization"). Outside a
    mesh with logical rules (plain ``apply``) this is ``w``. Experts' weights stay split over the
    mesh axes of the ``expert`` logical axis: the tokens travel to them instead.
    """
    rules = nn.get_logical_axis_rules()
    if not rules:
        return w
    batch = set(_axes(dict(rules).get(BATCH))) - set(_axes(dict(rules).get(EXPERT_AXIS)))
    gathered = tuple((logical, tuple(a for a in _axes(mesh) if a not in batch) or None) for logical, mesh in rules)
    return nn.with_logical_constraint(w, tuple(axes), rules=gathered)


def merge(plans: Iterable[Mapping[str, MeshAxes]]) -> ShardingPlan:
    """The union of ``plans`` (see ShardingPlan.merge)."""
    return ShardingPlan().merge(*plans)


def _axes(mesh: MeshAxes) -> tuple[str, ...]:
    if mesh is None:
        return ()
    return (mesh,) if isinstance(mesh, str) else tuple(mesh)
