"""GPT: the trainer's contract, configuration, validation, logical axes and sharding, training."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding

from theseus.config import ConfigError, configuration, configure, registry, schema_of
from theseus.model.layers import Block
from theseus.model.models import gpt as gpt_module
from theseus.model.models.gpt import GPT
from theseus.model.module import shapes_only
from theseus.tasks.lm import cross_entropy

TINY = {
    "architecture.vocab_size": 50, "architecture.seq_len": 16, "architecture.n_layers": 2,
    "architecture.d_model": 32, "architecture.n_heads": 4,
}
LLAMA = {
    **TINY, "architecture.norm": "rmsnorm", "architecture.activation": "swiglu", "architecture.positions": "rope",
    "architecture.bias": False, "architecture.tie_embeddings": False, "architecture.n_kv_heads": 2,
    "architecture.d_ff": 48,
}


def build(cfg, **kwargs) -> GPT:
    with configuration(cfg):
        return configure(GPT, **kwargs)


def tokens(batch=2, seq=8, vocab=50) -> jax.Array:
    return jnp.asarray(np.random.default_rng(7).integers(0, vocab, (batch, seq)), jnp.int32)


def abstract_params(model: GPT, x: jax.Array) -> dict:
    """What ``model.init(key, x)["params"]`` gives, traced, not run: boxed ShapeDtypeStructs."""
    return jax.eval_shape(model.init, jax.random.key(0), x)["params"]


def shapes(model: GPT, x: jax.Array) -> dict:
    return jax.tree.map(lambda a: a.shape, nn.unbox(abstract_params(model, x)))


def random_params(model: GPT, x: jax.Array, std: float = 0.02) -> dict:
    """Parameters shaped as init's, drawn with numpy (no RNG kernels to compile)."""
    rng = np.random.default_rng(0)
    abstract = nn.unbox(abstract_params(model, x))
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(0, std, s.shape), s.dtype), abstract)


def test_gpt_is_the_model_option_with_the_architecture_keys():
    registry.load()
    assert registry.options("model")["gpt"] is GPT
    keys = {key.removeprefix("architecture.") for key in schema_of(GPT)}
    assert keys == {
        "vocab_size", "seq_len", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "dropout", "bias",
        "qkv_bias", "norm", "norm_eps", "activation", "positions", "rope_theta", "tie_embeddings", "init_std",
        "attention_impl", "splash_fused_backward", "remat", "scan_layers", "dtype.param", "dtype.activation",
        "dtype.matmul", "lora.rank", "lora.alpha", "lora.dropout", "lora.targets",
        # the other families' layouts (each at a default that changes nothing)
        "head_dim", "qk_norm", "sliding_window", "global_every", "rope_theta_local", "attn_scale_dim", "attn_softcap",
        "logit_softcap", "post_norms", "scale_embeddings", "fused_projections", "rope_scaling.type",
        "rope_scaling.factor", "rope_scaling.low_freq_factor", "rope_scaling.high_freq_factor",
        "rope_scaling.original_seq_len",
    }
    defaults = {name: getattr(GPT(vocab_size=1), name) for name in ("n_layers", "d_model", "n_heads", "seq_len")}
    assert defaults == {"n_layers": 12, "d_model": 768, "n_heads": 12, "seq_len": 1024}


@pytest.mark.parametrize("cfg", [TINY, LLAMA], ids=["gpt2", "llama"])
def test_forward_shapes_dtypes_and_every_param_has_logical_axes(cfg):
    model = build(cfg, activation_dtype="bfloat16")
    logits = jax.jit(model.apply)({"params": random_params(model, tokens())}, tokens())
    assert logits.shape == (2, 8, 50) and logits.dtype == jnp.bfloat16
    boxes = jax.tree.leaves(abstract_params(model, tokens()), is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert boxes and all(isinstance(b, nn.Partitioned) and len(b.names) == b.value.ndim for b in boxes)
    assert all(b.value.dtype == jnp.float32 for b in boxes)


def test_llama_keys_change_the_parameter_tree():
    params = shapes(build(LLAMA), tokens())
    assert "wpe" not in params and params["lm_head"] == (32, 50)
    assert set(params["h_0"]["ln_1"]) == {"scale"} and set(params["ln_f"]) == {"scale"}
    assert params["h_0"]["attn"] == {"wq": (32, 4, 8), "wk": (32, 2, 8), "wv": (32, 2, 8), "wo": (4, 8, 32)}
    assert params["h_0"]["mlp"] == {"w_gate": (32, 48), "w_up": (32, 48), "w_out": (48, 32)}


@pytest.mark.parametrize("cfg", [TINY, LLAMA], ids=["gpt2", "llama"])
def test_sharding_plan_gives_valid_specs_on_a_2x2x2_mesh(cfg):
    model = build({**cfg, "architecture.d_model": 64, "architecture.vocab_size": 64})
    abstract = abstract_params(model, tokens())
    plan = model.sharding
    specs = plan.specs(abstract)
    mesh = AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"))
    used = set()
    for box, spec in zip(
        jax.tree.leaves(abstract, is_leaf=lambda x: isinstance(x, nn.Partitioned)), jax.tree.leaves(specs),
    ):
        NamedSharding(mesh, spec).shard_shape(box.value.shape)  # raises unless each split divides
        axes = [a for dim in spec for a in ((dim,) if isinstance(dim, str) else dim or ())]
        assert len(axes) == len(set(axes))
        used.update(axes)
    assert used == {"fsdp", "tensor"}  # parameters are split over fsdp and tensor, not data
    assert plan.spec(("batch", "seq", "embed")) == jax.sharding.PartitionSpec(("data", "fsdp", "expert"), None, None)
    assert plan.spec(("embed", "vocab")) == jax.sharding.PartitionSpec("fsdp", "tensor")
    # as Flax's rules (first claim wins) for the activations' constraints
    assert nn.logical_to_mesh_axes(("batch", "seq", "embed"), plan.rules())[0] == ("data", "fsdp", "expert")


def test_configured_under_a_context_then_jitted_outside_it():
    """The trap: children are built in setup(), inside init/apply under jit, after the context closed."""
    with configuration({**TINY, "architecture.n_layers": 1, "architecture.d_ff": 40, "architecture.n_kv_heads": 2}):
        model = configure(GPT)
    x = tokens()
    variables = jax.jit(model.init)(jax.random.key(0), x)
    params = nn.unbox(variables)["params"]
    assert params["h_0"]["mlp"]["w_out"].shape == (40, 32)
    assert params["h_0"]["attn"]["wv"].shape == (32, 2, 8)
    assert jax.jit(model.apply)(variables, x).shape == (2, 8, 50)


def test_field_values_reach_the_children():
    """A GPT built with explicit values (no configuration) or kwargs over one builds matching children."""
    direct = GPT(vocab_size=20, n_layers=1, d_model=24, n_heads=3, d_ff=40, positions="rope")
    params = shapes(direct, tokens(vocab=20))
    assert params["h_0"]["mlp"]["w_up"] == (24, 40) and "wpe" not in params
    over = build({**TINY, "architecture.d_model": 64}, d_model=16, n_heads=2)
    assert shapes(over, tokens())["h_0"]["attn"]["wq"] == (16, 2, 8)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"architecture.vocab_size": None}, "architecture.vocab_size is not set: set architecture.vocab_size=N"),
        ({"architecture.n_heads": 5}, r"architecture.d_model \(32\) must be divisible by architecture.n_heads \(5\)"),
        ({"architecture.n_kv_heads": 3}, r"architecture.n_heads \(4\) must be divisible by architecture.n_kv_heads"),
        ({"architecture.n_heads": 32, "architecture.positions": "rope"}, "architecture.positions=rope needs an even"),
        ({"architecture.n_layers": 0}, "architecture.n_layers must be positive, got 0"),
        ({"architecture.rope_theta": -1.0}, "architecture.rope_theta must be positive, got -1.0"),
        ({"architecture.init_std": -0.02}, "architecture.init_std must be positive, got -0.02"),
        ({"architecture.dropout": 1.0}, r"architecture.dropout must be in \[0, 1\), got 1.0"),
        ({"architecture.norm": "batchnorm"}, "architecture.norm must be one of layernorm, rmsnorm, rmsnorm_offset, got 'batchnorm'"),
    ],
)
def test_validation_fails_at_configuration_with_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        build({**TINY, **overrides})
    assert "\n" not in str(error.value)


def test_sequence_longer_than_seq_len_is_refused():
    model = build(TINY)
    with pytest.raises(ValueError, match=r"a sequence of 17 tokens exceeds architecture.seq_len \(16\)"):
        abstract_params(model, tokens(seq=17))


@pytest.mark.slow
def test_dropout_uses_the_dropout_stream_only_when_not_deterministic():
    model = build({**TINY, "architecture.dropout": 0.2})
    x = tokens()
    variables = {"params": random_params(model, x)}
    apply = jax.jit(model.apply, static_argnames="deterministic")
    clean = apply(variables, x)
    np.testing.assert_array_equal(clean, jax.jit(build(TINY).apply)(variables, x))
    noisy = [apply(variables, x, deterministic=False, rngs={"dropout": jax.random.key(s)}) for s in (1, 1, 2)]
    np.testing.assert_array_equal(noisy[0], noisy[1])
    assert not np.allclose(noisy[0], clean) and not np.allclose(noisy[0], noisy[2])


@pytest.mark.slow
def test_loss_decreases_with_gradient_steps():
    model = build(LLAMA)
    x = tokens(seq=9)
    params = random_params(model, x[:, :-1], std=0.3)

    @jax.jit
    def step(p):
        value, grads = jax.value_and_grad(lambda p: cross_entropy(model.apply({"params": p}, x[:, :-1]), x[:, 1:]))(p)
        return jax.tree.map(lambda w, g: w - 0.5 * g, p, grads), value

    losses = []
    for _ in range(6):
        params, value = step(params)
        losses.append(float(value))
    assert losses[-1] < losses[0] - 0.1


TRACES: list[int] = []


class CountedBlock(Block):
    """A Block that notes each trace of its call."""

    def __call__(self, x, positions, deterministic=True, segments=None):
        TRACES.append(1)
        return super().__call__(x, positions, deterministic, segments=segments)


class CountedGPT(GPT):
    block_cls = CountedBlock


def counted(cfg) -> CountedGPT:
    with configuration(cfg):
        return configure(CountedGPT)


@pytest.mark.parametrize(("extra", "traces"), [
    ({}, 1), ({"architecture.sliding_window": 4, "architecture.global_every": 2}, 2),
    ({"architecture.remat": "dots"}, 1),
])
def test_layers_alike_share_one_trace_and_compute_the_same_numbers(monkeypatch, extra, traces):
    """The step traces a block once for its layers alike (a sliding-window model: once for its
    sliding layers, once for its global ones), and its loss and gradients are bit for bit those
    of every layer traced on its own."""
    cfg, x = {**LLAMA, "architecture.n_layers": 4, **extra}, tokens()
    params = random_params(build(cfg), x)

    def step(model):
        return jax.jit(jax.value_and_grad(lambda p: cross_entropy(model.apply({"params": p}, x[:, :-1]), x[:, 1:])))

    TRACES.clear()
    shared = step(counted(cfg)).trace(params)
    assert len(TRACES) == traces
    loss, grads = shared.lower().compile()(params)
    monkeypatch.setattr(gpt_module, "traced_once", lambda block_cls: block_cls)
    TRACES.clear()
    alone = step(counted(cfg)).trace(params)
    assert len(TRACES) == 4
    expected_loss, expected_grads = alone.lower().compile()(params)
    assert float(loss) == float(expected_loss)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), grads, expected_grads)


def test_a_shared_trace_is_kept_apart_under_other_logical_axis_rules():
    """A trace bakes in the sharding constraints of the rules in force: other rules, another trace."""
    with nn.logical_axis_rules([("batch", "data")]):
        first, again = gpt_module.traced_once(Block), gpt_module.traced_once(Block)
    with nn.logical_axis_rules([("batch", None)]):
        other = gpt_module.traced_once(Block)
    with nn.logical_axis_rules([("batch", ["data", "fsdp"])]):  # a list, as a user may write one
        listed = gpt_module.traced_once(Block)
    assert first is again and other is not first and listed not in (first, other)


def test_each_layer_of_a_shared_trace_draws_its_own_dropout():
    class Dropped(nn.Module):
        @nn.compact
        def __call__(self, x, positions, deterministic):
            return nn.Dropout(0.5)(x, deterministic=deterministic)

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, x):
            return [gpt_module.traced_once(Dropped)(name=f"h_{i}")(x, None, False) for i in range(3)]

    masks = [np.asarray(out) != 0 for out in Stack().apply({}, jnp.ones((1, 64)), rngs={"dropout": jax.random.key(0)})]
    assert all(0 < mask.sum() < 64 for mask in masks)
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


@pytest.mark.parametrize(("extra", "traces"), [
    ({}, 1), ({"architecture.sliding_window": 4, "architecture.global_every": 2}, 2),
    ({"architecture.lora.rank": 2}, 1),
])
def test_an_init_traced_for_shapes_alone_shares_the_trace_and_gives_the_same_tree(extra, traces):
    """An init drawing values traces each layer on its own (each draws from its own path's key);
    one traced for shapes alone (``shapes_only``, the layout a checkpoint loads onto) shares the
    layers' trace, and gives the same tree: paths, shapes, dtypes and logical axes."""
    model, x = counted({**LLAMA, "architecture.n_layers": 4, **extra}), tokens()
    TRACES.clear()
    drawn = jax.eval_shape(model.init, jax.random.key(0), x)
    assert len(TRACES) == 4
    TRACES.clear()
    with shapes_only():
        shaped = jax.eval_shape(model.init, jax.random.key(0), x)
    assert len(TRACES) == traces
    assert jax.tree.structure(shaped) == jax.tree.structure(drawn)  # Partitioned's axis names included
    assert jax.tree.leaves(shaped) == jax.tree.leaves(drawn)  # ShapeDtypeStructs: shapes and dtypes
