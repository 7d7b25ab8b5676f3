"""architecture.remat and architecture.scan_layers: the same numbers as the unrolled model
without remat, less memory, stacked parameters that convert both ways, and every hook
(subclassed blocks, generation, FLOPs, sharding, the GPT-2 import) working on top."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from theseus.base.axis import LAYERS
from theseus.config import ConfigError, configuration, configure
from theseus.model.generate import generate
from theseus.model.layers import MLP, Block
from theseus.model.models.gpt import GPT, stack_layers, unstack_layers
from theseus.tasks.lm import cross_entropy

TINY = {
    "architecture.vocab_size": 64, "architecture.seq_len": 16, "architecture.n_layers": 3,
    "architecture.d_model": 32, "architecture.n_heads": 4,
}
LLAMA = {
    **TINY, "architecture.norm": "rmsnorm", "architecture.activation": "swiglu", "architecture.positions": "rope",
    "architecture.bias": False, "architecture.tie_embeddings": False, "architecture.n_kv_heads": 2,
}


def build(cfg=TINY, cls=GPT, **kwargs) -> GPT:
    with configuration(cfg):
        return configure(cls, **kwargs)


def tokens(batch=2, seq=16, vocab=64) -> jax.Array:
    return jnp.asarray(np.random.default_rng(7).integers(0, vocab, (batch, seq)), jnp.int32)


def init(model: GPT, std: float = 0.02) -> dict:
    """Parameters shaped as init's, drawn with numpy (no RNG kernels to compile)."""
    rng = np.random.default_rng(0)
    abstract = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens())["params"])
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(0, std, s.shape), s.dtype), abstract)


def loss_and_grads(model: GPT, params: dict, deterministic: bool = True) -> tuple[jax.Array, dict]:
    """Next-token loss of ``tokens()`` and its gradients (dropout drawn from a fixed key)."""
    x = tokens()

    def loss(p):
        logits = model.apply({"params": p}, x[:, :-1], deterministic=deterministic, rngs={"dropout": jax.random.key(3)})
        return cross_entropy(logits, x[:, 1:])

    return jax.jit(jax.value_and_grad(loss))(params)


def max_diff(a: dict, b: dict) -> float:
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b)))


@pytest.mark.slow
@pytest.mark.parametrize("scan, remat", [(False, "full"), (True, "dots")])
def test_remat_changes_neither_loss_nor_gradients_dropout_included(scan, remat):
    cfg = {**TINY, "architecture.n_layers": 2, "architecture.dropout": 0.1}
    reference = build(cfg, scan_layers=scan)
    params = init(reference)
    loss, grads = loss_and_grads(reference, params, deterministic=False)
    loss_r, grads_r = loss_and_grads(build(cfg, scan_layers=scan, remat=remat), params, deterministic=False)
    assert abs(float(loss) - float(loss_r)) <= 1e-6
    assert max_diff(grads, grads_r) <= 1e-6
    plain = jax.jit(lambda p: cross_entropy(reference.apply({"params": p}, tokens()[:, :-1]), tokens()[:, 1:]))(params)
    assert abs(float(loss) - float(plain)) > 1e-4  # dropout was on: remat replayed its masks


def test_remat_is_a_checked_choice():
    with pytest.raises(ConfigError, match="architecture.remat must be one of none, dots, full, got 'some'"):
        build({**TINY, "architecture.remat": "some"})


def temp_bytes(model: GPT, batch: int) -> int:
    """XLA's temporary memory for the gradient of the loss of ``[batch, seq]`` tokens."""
    seq = model.seq_len
    params = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, seq), jnp.int32))["params"])

    def loss(p, x):
        return cross_entropy(model.apply({"params": p}, x[:, :-1]), x[:, 1:])

    compiled = jax.jit(jax.grad(loss)).lower(params, jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32)).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_temporary_memory_falls_from_none_to_dots_to_full():
    """On a model whose activations dominate (4 layers, d_model 128, 128 positions, batch 8).

    Scanned: XLA's CPU scheduler places an unrolled model's recomputation early, so that its
    temp memory hardly moves with remat (benchmarks/README.md); a scan body's cannot."""
    cfg = {**TINY, "architecture.n_layers": 4, "architecture.d_model": 128, "architecture.seq_len": 128,
           "architecture.vocab_size": 256}
    none, dots, full = (temp_bytes(build(cfg, scan_layers=True, remat=r), batch=8) for r in ("none", "dots", "full"))
    assert none > 1.5 * dots and dots > 1.1 * full, (none, dots, full)


@pytest.mark.slow
def test_scanned_layers_equal_the_unrolled_model_given_the_same_parameters():
    cfg = LLAMA
    unrolled = build(cfg)
    params = init(unrolled)
    stacked = stack_layers(params)
    assert stacked["h"]["mlp"]["w_out"].shape == (3, 128, 32) and "h_0" not in stacked and "lm_head" in stacked
    loss, grads = loss_and_grads(unrolled, params)
    loss_s, grads_s = loss_and_grads(build(cfg, scan_layers=True), stacked)
    assert abs(float(loss) - float(loss_s)) <= 1e-5
    assert max_diff(grads, unstack_layers(grads_s)) <= 1e-5


@pytest.mark.slow
def test_stacking_round_trips_and_matches_a_scanned_init():
    params = init(build())
    back = unstack_layers(stack_layers(params))
    assert jax.tree.structure(back) == jax.tree.structure(params)
    assert max_diff(back, params) == 0.0
    scanned = nn.unbox(build(scan_layers=True).init(jax.random.key(0), tokens())["params"])
    assert jax.tree.map(jnp.shape, scanned) == jax.tree.map(jnp.shape, stack_layers(params))
    layers = unstack_layers(scanned)  # the scan draws each layer's init apart
    assert not np.allclose(layers["h_0"]["mlp"]["w_out"], layers["h_1"]["mlp"]["w_out"])
    with pytest.raises(ValueError, match="already stacked"):
        stack_layers(scanned)
    with pytest.raises(ValueError, match="already unrolled"):
        unstack_layers(params)


def test_stacked_parameters_lead_with_the_layers_axis_which_is_not_sharded():
    model = build(scan_layers=True)
    boxed = jax.eval_shape(model.init, jax.random.key(0), tokens())["params"]
    assert boxed["h"]["attn"]["wq"].names == (LAYERS, "embed", "heads", "head_dim")
    plan = model.plan()
    assert plan[LAYERS] is None
    assert plan.spec(boxed["h"]["attn"]["wq"].names) == PartitionSpec(None, "fsdp", "tensor", None)


class ScaledMLP(MLP):
    """An MLP whose output is doubled (a user's extension)."""

    def __call__(self, x, deterministic=True):
        return 2.0 * super().__call__(x, deterministic)

    def flops(self, seq):
        return 2 * super().flops(seq)


class ScaledBlock(Block):
    mlp_cls = ScaledMLP


class ScaledGPT(GPT):
    block_cls = ScaledBlock


@pytest.mark.parametrize("scan, remat", [(False, "full"), (True, "dots")])
def test_a_subclassed_block_is_remat_and_scanned(scan, remat):
    plain = build(cls=ScaledGPT)
    params = init(plain)
    model = build(cls=ScaledGPT, scan_layers=scan, remat=remat)
    got = model.apply({"params": stack_layers(params) if scan else params}, tokens())
    np.testing.assert_allclose(got, plain.apply({"params": params}, tokens()), atol=1e-5)
    assert not np.allclose(got, build().apply({"params": params}, tokens()), atol=1e-3)  # ScaledMLP ran
    assert model.flops(16) == plain.flops(16) > build().flops(16)


@pytest.mark.parametrize("cfg", [TINY, LLAMA], ids=["gpt2", "llama"])
def test_flops_of_a_scanned_model_equal_the_unrolled_count(cfg):
    assert build(cfg, scan_layers=True).flops(16) == build(cfg).flops(16) == build(cfg, remat="dots").flops(16)


def test_kv_cache_generation_through_scanned_layers_equals_the_unrolled_model():
    unrolled = build(LLAMA)
    params = init(unrolled, std=0.5)  # wide enough that greedy continuations vary
    prompt = tokens(seq=5)
    expected = generate(unrolled, params, prompt, max_new_tokens=8, temperature=0.0)
    got = generate(build(LLAMA, scan_layers=True, remat="full"), stack_layers(params), prompt, max_new_tokens=8,
                   temperature=0.0)
    np.testing.assert_array_equal(got, expected)
    assert len(set(np.asarray(got[:, 5:]).ravel().tolist())) > 1
