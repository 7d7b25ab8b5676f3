"""Splash attention: Pallas's TPU flash-attention kernel (``jax.experimental.pallas.ops.tpu.
splash_attention``), the attention a TPU runs by default (``architecture.attention_impl=auto``).

It never writes the ``[seq, seq]`` scores to HBM: each block of queries meets the blocks of keys
its mask reaches, in VMEM, with an online softmax; blocks the mask hides entirely (above the
causal diagonal, outside a sliding window) are skipped, forward and backward. Grouped-query
attention reads each kv head for its group of query heads (query head n reads kv head
n // (heads / kv_heads), as ``grouped_attention``); packed sequences are kept apart by segment
ids; Gemma 2's score soft-cap is the kernel's own. The kernel sees one sequence's heads: it is
mapped over the batch, and under a mesh run per device on its share of the batch and heads
(``shard_map``), as the step's sharding lays them out. Off a TPU it runs in Pallas's
interpreter (a test's path: slow, the same arithmetic).

Shapes: ``q: [batch, seq, heads, head_dim]``, ``k, v: [batch, seq, kv_heads, head_dim]``,
``segments: int32[batch, seq] | None``.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from theseus.base.axis import BATCH, HEADS, KV_HEADS

# Query and key block sizes, largest first: 512 at GPT-2's 1024 positions (MaxText's default on
# v5e), a smaller one where 512 does not divide the sequence; the kernel's lanes are 128 wide.
BLOCKS = (512, 256, 128)
ATTENTION_OUTPUT = "attention_output"  # the kernel's output and logsumexp: what remat=dots keeps of it


def block_size(seq: int) -> int | None:
    """The kernel's block for ``seq`` positions: the largest of ``BLOCKS`` dividing it (None:
    none does, and the kernel does not apply)."""
    return next((block for block in BLOCKS if seq % block == 0), None)


def visible(seq: int, window: int | None) -> np.ndarray:
    """``bool[seq, seq]``: the keys (columns) each query (row) sees: those at or before it,
    fewer than ``window`` back when set."""
    gap = np.arange(seq)[:, None] - np.arange(seq)[None, :]
    return (gap >= 0) if window is None else (gap >= 0) & (gap < window)


def computed_pairs(seq: int, window: int | None) -> int:
    """The (query, key) pairs the kernel computes scores for in one head of one sequence: every
    pair of each block of ``block_size(seq)`` queries and keys its mask reaches at all (the
    blocks it skips are counted out, a partly masked block counts in full)."""
    block = block_size(seq)
    n = seq // block
    reached = visible(seq, window).reshape(n, block, n, block).any(axis=(1, 3))
    return int(reached.sum()) * block * block


def skips_blocks(seq: int, window: int | None) -> bool:
    """Whether the kernel skips any block of ``seq`` positions' scores (its mask leaves one out):
    where it does not (a sequence of one block), it computes every pair, as the attention written
    out does, and slower (gpt_small, seq 256, on a TPU v5e: 4.58 ms a step against 3.15)."""
    return block_size(seq) is not None and computed_pairs(seq, window) < seq * seq


def _kernel(seq: int, heads: int, window: int | None, softcap: float | None, fused_backward: bool,
            interpret: bool):
    """The splash kernel of one sequence of ``seq`` positions and ``heads`` query heads, made in the
    trace that calls it: it turns its mask's block maps (computed on the host, and cached there by
    Pallas) into arrays of that trace. A kernel kept across traces held the first one's tracers,
    which the next took as inputs (on a TPU: an init compiled for 5 inputs and called with none).
    ``fused_backward``: dq computed in the dk and dv kernel (the scores recomputed once, not twice)."""
    block = block_size(seq)
    mask = (splash.CausalMask((seq, seq)) if window is None
            else splash.LocalMask((seq, seq), window_size=(window - 1, 0), offset=0))
    dq = {"use_fused_bwd_kernel": True} if fused_backward else {"block_q_dq": block, "block_kv_dq": block}
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, **dq)
    return splash.make_splash_mha(splash.MultiHeadMask([mask] * heads), block_sizes=sizes, head_shards=1,
                                  q_seq_shards=1, attn_logits_soft_cap=softcap, interpret=interpret,
                                  residual_checkpoint_name=ATTENTION_OUTPUT)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array | None, *, scale: float,
                     window: int | None = None, softcap: float | None = None, fused_backward: bool = False,
                     interpret: bool = False) -> jax.Array:
    """Causal attention of ``q`` over ``k, v`` (scores times ``scale``, soft-capped by ``softcap``
    when set; a query sees the ``window - 1`` keys before it when set; only its own segment's
    with ``segments``) -> ``[batch, seq, heads, head_dim]`` in q's dtype. ``seq`` must have a
    ``block_size``; ``fused_backward``: the gradient by one kernel (``_kernel``)."""

    def local(q, k, v, *segments):
        kernel = _kernel(q.shape[1], q.shape[2], window, softcap, fused_backward, interpret)
        heads_first = [x.swapaxes(1, 2) for x in ((q * scale).astype(q.dtype), k, v)]  # [batch, heads, seq, dim]
        if segments:
            out = jax.vmap(lambda q, k, v, ids: kernel(q, k, v, segment_ids=splash.SegmentIds(ids, ids)))(
                *heads_first, *segments)
        else:
            out = jax.vmap(kernel)(*heads_first)
        return out.swapaxes(1, 2)

    operands = (q, k, v) if segments is None else (q, k, v, segments)
    specs = _specs(q.shape[0], q.shape[2], k.shape[2])
    if specs is None:
        return local(*operands)
    heads, ids = specs
    return jax.shard_map(local, in_specs=(heads, heads, heads, ids)[:len(operands)], out_specs=heads,
                         check_vma=False)(*operands)


def _specs(batch: int, heads: int, kv_heads: int) -> tuple[PartitionSpec, PartitionSpec] | None:
    """How the step lays out q, k and v, and the segment ids, over the mesh in force (None: no
    mesh): the batch over its mesh axes, the heads over theirs (tensor) where both the query and
    the kv heads split evenly over them; what does not split evenly, whole on every device."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return None
    rows, tensor = nn.logical_to_mesh_axes((BATCH,))[0], nn.logical_to_mesh_axes((HEADS,))[0]
    split = _size(mesh, tensor)
    if nn.logical_to_mesh_axes((KV_HEADS,))[0] != tensor or heads % split or kv_heads % split:
        tensor = None
    if batch % _size(mesh, rows):
        rows = None
    return PartitionSpec(rows, None, tensor, None), PartitionSpec(rows)


def _size(mesh: jax.sharding.AbstractMesh, axes: str | tuple[str, ...] | None) -> int:
    """How many shards ``axes`` of ``mesh`` split an array's dimension into."""
    names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape[name] for name in names)
