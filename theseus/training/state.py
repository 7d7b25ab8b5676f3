"""The train state, created already sharded over the mesh (no host copy of the model)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from theseus.base.axis import EXPERT_AXIS, HEADS, KV_HEADS, LAYERS, ShardingPlan
from theseus.config import ConfigError
from theseus.model.module import shapes_only


# The init runs once, and is mostly the random draws' hashing: LLVM's -O1 compiles it several
# times faster than the default -O2, to the same values (benchmarks/README.md has the figures).
INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


class TrainState(struct.PyTreeNode):
    """Everything a step updates: float32 master params, optimizer state, the step count, and
    the record of updates refused for a non-finite loss or gradient."""

    step: jax.Array
    params: Any
    opt_state: optax.OptState
    nonfinite: jax.Array  # int32: updates skipped so far
    first_nonfinite: jax.Array  # int32: the first step whose loss or gradients were not finite; 0: none


def init_state(model: nn.Module, tx: optax.GradientTransformation, seq_len: int, seed: int) -> TrainState:
    """A fresh state, with logical-axis boxes (``nn.Partitioned``) kept on params and moments."""
    tokens = jnp.zeros((1, seq_len), jnp.int32)
    params = model.init(jax.random.key(seed), tokens, deterministic=True)["params"]
    zero = jnp.zeros((), jnp.int32)
    return TrainState(step=zero, params=params, opt_state=tx.init(params), nonfinite=zero, first_nonfinite=zero)


def state_shardings(abstract: TrainState, plan: ShardingPlan, mesh: Mesh) -> Any:
    """NamedShardings for every leaf of a (boxed) abstract state: params and moments by plan;
    ConfigError for a parameter that the mesh does not split evenly (``check_divisible``)."""
    check_divisible(abstract.params, plan, mesh)
    specs = plan.specs(abstract)
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


# the key whose value a logical axis's size is, where one key sizes it (what a mesh that does not split it names)
SIZED_BY = {EXPERT_AXIS: "architecture.moe.n_experts", HEADS: "architecture.n_heads",
            KV_HEADS: "architecture.n_kv_heads", LAYERS: "architecture.n_layers"}


def check_divisible(params: Any, plan: ShardingPlan, mesh: Mesh) -> None:
    """ConfigError naming the first parameter (of boxed abstract ``params``) whose size along a
    logical axis the mesh axes ``plan`` maps it to do not divide: an axis of 3 experts over
    ``mesh.expert=2``, of 1 key/value head over ``mesh.tensor=2``. The fix: mesh sizes that divide
    it, or the axis replicated (``mesh.rules.AXIS=null``)."""
    boxed = jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    for path, leaf in boxed:
        if not isinstance(leaf, nn.Partitioned):
            continue
        for size, logical, axes in zip(leaf.value.shape, leaf.names, plan.spec(leaf.names)):
            axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
            split = math.prod(mesh.shape[axis] for axis in axes)
            if size % split:
                name = "/".join(str(getattr(key, "key", key)) for key in path)
                over = " x ".join(f"mesh.{axis}={mesh.shape[axis]}" for axis in axes)
                key = SIZED_BY.get(logical)
                sized, resize = (f" ({key}={size})", f"set {key} to a multiple of {split}, ") if key else ("", "")
                raise ConfigError(f"parameter {name} {list(leaf.value.shape)} has {size} along its {logical!r} axis"
                                  f"{sized}, which {over} does not split evenly: {resize}give mesh sizes that divide "
                                  f"{size}, or keep that axis whole on every device (mesh.rules.{logical}=null)")


def sharded_init(model: nn.Module, tx: optax.GradientTransformation, seq_len: int, seed: int,
                 plan: ShardingPlan, mesh: Mesh) -> tuple[Callable[[], TrainState], TrainState, Any]:
    """How to create the state sharded: ``(init, target, shardings)``.

    ``init()`` creates every array on its own devices (a jitted init with out_shardings: no
    host copy of the model); ``init(params)``, the state around ``params`` already laid out
    (a checkpoint's or a folder's weights: none drawn only to be dropped), the optimizer's
    state fresh; ``target`` holds ShapeDtypeStructs with those shardings, the layout a
    checkpoint restores onto.
    """
    with shapes_only():
        boxed = jax.eval_shape(lambda: init_state(model, tx, seq_len, seed))
    shardings = state_shardings(boxed, plan, mesh)
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nn.unbox(boxed), shardings)
    jitted = jax.jit(lambda: nn.unbox(init_state(model, tx, seq_len, seed)), out_shardings=shardings)

    def init(params: Any = None) -> TrainState:
        with jax.set_mesh(mesh), nn.logical_axis_rules(plan.rules()):
            if params is None:
                return jitted.lower().compile(INIT_COMPILER_OPTIONS)()
            step, nonfinite, first = (jax.device_put(np.int32(0), shardings.step) for _ in range(3))  # donated apart
            opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
            return TrainState(step=step, params=params, opt_state=opt_state, nonfinite=nonfinite, first_nonfinite=first)

    return init, target, shardings


def bytes_per_device(tree: Any) -> int:
    """Bytes one device holds of ``tree`` (arrays, or ShapeDtypeStructs with shardings)."""
    return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
               for leaf in jax.tree.leaves(tree))


def n_params(params: Any) -> int:
    return sum(leaf.size for leaf in jax.tree.leaves(params))
