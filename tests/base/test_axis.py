"""ShardingPlan: merging, conflicts, PartitionSpecs from logical axes."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from theseus.base.axis import ShardingPlan, merge
from theseus.config import configuration, configure
from theseus.model.layers import MLP


def test_spec_maps_logical_axes():
    plan = ShardingPlan(embed="fsdp", mlp="tensor", batch=("data", "fsdp"))
    assert plan.spec(("embed", "mlp")) == P("fsdp", "tensor")
    assert plan.spec(("batch", None, "unknown")) == P(("data", "fsdp"), None, None)
    assert plan.spec(("embed", "embed")) == P("fsdp", None)  # one mesh axis per array once


def test_merge_unions_and_conflicts_name_the_axis():
    merged = merge([ShardingPlan(embed="fsdp"), ShardingPlan(mlp="tensor"), ShardingPlan(embed="fsdp")])
    assert dict(merged) == {"embed": "fsdp", "mlp": "tensor"}
    with pytest.raises(ValueError, match="conflict on logical axis 'embed'"):
        ShardingPlan(embed="fsdp").merge(ShardingPlan(embed="tensor"))
    assert ShardingPlan(embed="fsdp").override({"embed": None})["embed"] is None


def test_unknown_mesh_axis_is_rejected():
    with pytest.raises(ValueError, match="'model' is not a mesh axis"):
        ShardingPlan(embed="model")


def test_specs_for_an_annotated_parameter_tree():
    with configuration({"architecture.d_model": 8, "architecture.d_ff": 16}):
        mlp = configure(MLP)
    abstract = jax.eval_shape(mlp.init, jax.random.key(0), jnp.ones((1, 2, 8)))
    specs = ShardingPlan(embed="fsdp", mlp="tensor").specs(abstract["params"])
    assert specs == {"w_up": P("fsdp", "tensor"), "w_out": P("tensor", "fsdp"), "b_up": P("tensor"), "b_out": P("fsdp")}
    # the same rules through Flax's own logical-axis machinery
    rules = ShardingPlan(embed="fsdp", mlp="tensor").rules()
    assert nn.get_partition_spec(abstract)["params"]["w_out"] == P("mlp", "embed")
    assert nn.logical_to_mesh_axes(("mlp", "embed"), rules) == P("tensor", "fsdp")
