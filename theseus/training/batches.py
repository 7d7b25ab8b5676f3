"""Batches on the mesh: how a global batch is split over devices and which share of it each
process reads.

A batch is ``[batch, *example]`` (evaluation) or ``[grad_accum, micro, *example]`` (a train
step), its examples split over the mesh axes ``BATCH_MESH_AXES`` (data, fsdp, expert). An example
is the task's pytree (one int32 array for ``lm``; a dict of arrays for ``dpo``): every leaf of a
batch leads with the same batch axes and is split alike.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from theseus.base.axis import BATCH_MESH_AXES
from theseus.base.mesh import on_devices
from theseus.config import ConfigError


def batch_sharding(mesh: Mesh, accumulated: bool = False) -> NamedSharding:
    """Examples split over (data, fsdp, expert), their other axes whole (a leaf of any rank);
    ``accumulated`` batches lead with grad_accum."""
    spec = PartitionSpec(None, BATCH_MESH_AXES) if accumulated else PartitionSpec(BATCH_MESH_AXES)
    return NamedSharding(mesh, spec)


def batch_share(mesh: Mesh, micro: int) -> tuple[int, int]:
    """``(index, count)``: this process reads share ``index`` of ``count`` equal, contiguous
    shares of every micro-batch of ``micro`` sequences, the sequences its devices hold.

    ``count`` is the number of processes when the batch's mesh axes split it across them;
    processes whose devices hold the same sequences (a tensor axis spanning hosts) read the
    same share.
    """
    held = {(rows.start or 0, micro if rows.stop is None else rows.stop)
            for rows, *_ in batch_sharding(mesh).addressable_devices_indices_map((micro, 1)).values()}
    first, end = min(start for start, _ in held), max(stop for _, stop in held)
    if sum(stop - start for start, stop in held) != end - first or first % (end - first):
        raise ConfigError(f"process {jax.process_index()}'s devices hold sequences {sorted(held)} of each "
                          f"batch of {micro}, not one contiguous share: give mesh.data x mesh.fsdp x mesh.expert "
                          f"a multiple of the {jax.process_count()} processes, or make it 1")
    return first // (end - first), micro // (end - first)


def global_batch(host: Any, mesh: Mesh, batch_size: int, grad_accum: int) -> Any:
    """This process's ``[local_batch, *example]`` (each leaf of the example's pytree) as one
    global ``[grad_accum, batch_size / grad_accum, *example]`` array, sharded."""
    sharding = batch_sharding(mesh, accumulated=True)

    def place(leaf: np.ndarray) -> jax.Array:
        local = leaf.reshape(grad_accum, -1, *leaf.shape[1:])
        return on_devices(local, sharding, (grad_accum, batch_size // grad_accum, *leaf.shape[1:]))

    return jax.tree.map(place, host)
