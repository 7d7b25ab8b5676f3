"""GPT.flops: the documented convention, parents summing children, and XLA's own count."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from support import tpu_mesh
from theseus.config import configuration, configure
from theseus.model.layers import MLP, Attention, Block
from theseus.model.models.gpt import GPT
from theseus.tasks.lm import cross_entropy

GPT2 = {
    "architecture.vocab_size": 512, "architecture.seq_len": 128, "architecture.n_layers": 2,
    "architecture.d_model": 256, "architecture.n_heads": 4,
}
LLAMA = {
    "architecture.vocab_size": 1024, "architecture.seq_len": 256, "architecture.n_layers": 2,
    "architecture.d_model": 192, "architecture.n_heads": 6, "architecture.n_kv_heads": 2, "architecture.d_ff": 512,
    "architecture.norm": "rmsnorm", "architecture.activation": "swiglu", "architecture.positions": "rope",
    "architecture.bias": False, "architecture.tie_embeddings": False,
}


def build(cls, cfg):
    with configuration(cfg):
        return configure(cls)


def matmul_params(params: dict, tied: bool) -> int:
    """Elements of the weights used in matmuls, read off the parameter tree: the projections,
    the untied head, or the token table when it is the head."""
    weights = {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_out", "lm_head"}
    total = params["wte"]["embedding"].size if tied else 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        total += leaf.size if path[-1].key in weights else 0
    return total


@pytest.mark.parametrize("cfg", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_flops_is_six_matmul_params_per_token_plus_attention(cfg):
    model = build(GPT, cfg)
    seq = 64
    abstract = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, seq), jnp.int32)))["params"]
    attention = 12 * model.n_layers * model.d_model * seq**2
    assert model.flops(seq) == 6 * matmul_params(abstract, model.tie_embeddings) * seq + attention


def test_a_parent_counts_its_children_plus_its_own():
    model = build(GPT, LLAMA)
    block, attn, mlp = (build(cls, LLAMA) for cls in (Block, Attention, MLP))
    assert block.flops(100) == attn.flops(100) + mlp.flops(100)
    assert model.flops(100) == 2 * block.flops(100) + 6 * 192 * 1024 * 100


@pytest.mark.parametrize("cfg", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_flops_agrees_with_xla_cost_analysis_within_5_percent(cfg):
    model = build(GPT, cfg)
    seq = model.seq_len
    x = jnp.zeros((1, seq), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), x)["params"]

    def loss(p, tokens):
        return cross_entropy(model.apply({"params": p}, tokens), tokens)

    compiled = jax.jit(jax.grad(loss)).lower(params, x).compile()
    xla = compiled.cost_analysis()["flops"]
    assert abs(model.flops(seq) - xla) / xla < 0.05, (model.flops(seq), xla)


def lora_step_gradient(model, seq: int):
    """What a LoRA train step differentiates, abstractly: ``(grad, train, frozen, tokens, mask)``,
    ``grad(train, frozen, tokens)`` the gradient of the loss of one sequence with respect to the
    trainable params alone (``optimizer.trainable``), the frozen ones an input it does not
    differentiate, as ``training.step.train_step`` splits them."""
    from theseus.model.lora import trainable
    from theseus.training.step import combine, partition

    tokens = jax.ShapeDtypeStruct((1, seq + 1), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, seq), jnp.int32))["params"]
    mask = trainable(params)
    train, frozen = partition(params, mask)

    def loss(train, frozen, tokens):
        return cross_entropy(model.apply({"params": combine(train, frozen)}, tokens[:, :-1]), tokens[:, 1:])

    return jax.grad(loss), train, frozen, tokens, mask


@pytest.mark.parametrize("cfg", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_lora_flops_count_four_per_frozen_weight_and_six_per_adapter(cfg):
    model = build(GPT, {**cfg, "architecture.lora.rank": 4, "architecture.lora.targets": ["q", "v", "down"]})
    seq = 64
    *_, mask = lora_step_gradient(model, seq)
    params = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, seq), jnp.int32)))["params"]
    adapters = sum(leaf.size for path, leaf in jax.tree_util.tree_leaves_with_path(params)
                   if "lora_" in jax.tree_util.keystr(path))
    assert adapters > 0
    attention = 12 * model.n_layers * model.d_model * seq**2
    frozen = 4 * matmul_params(params, model.tie_embeddings) * seq
    assert model.flops(seq, trainable=mask) == frozen + 6 * adapters * seq + attention
    everything = jax.tree.map(lambda _: True, mask)  # a mask that trains every weight: the convention's 6
    assert model.flops(seq, trainable=everything) == 6 * (matmul_params(params, model.tie_embeddings) + adapters) * seq \
        + attention


@pytest.mark.parametrize("cfg", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_lora_flops_agree_with_xla_within_5_percent(cfg):
    """XLA's count of the gradient a LoRA step takes (the adapters alone, the base an input)
    against ``flops(seq, trainable=mask)``; the count of every weight's gradient is a third
    larger in the projections and the head, over the 5%."""
    model = build(GPT, {**cfg, "architecture.lora.rank": 8})
    seq = 64
    grad, train, frozen, tokens, mask = lora_step_gradient(model, seq)
    xla = jax.jit(grad).lower(train, frozen, tokens).compile().cost_analysis()["flops"]
    assert abs(model.flops(seq, trainable=mask) - xla) / xla < 0.05, (model.flops(seq, trainable=mask), xla)
    assert abs(model.flops(seq) - xla) / xla > 0.15  # counting the frozen weights' gradients is far off


def test_a_sliding_window_layer_counts_the_pairs_its_kernel_computes():
    """Written out (the CPU's), every layer computes all seq^2 scores, a window masking them
    after; splash (a TPU's) computes the blocks its mask reaches: at 768 positions, blocks of
    256, a window of 100 reaches the diagonal's 3 and the 2 below it of the 9; the global layers
    (every ``global_every``-th) and the causal ones reach 6. The projections do not change."""
    seq, window = 768, 100
    per_pair = 12 * 6 * 32  # heads x head_dim, forward and backward
    sliding, mixed = ({**LLAMA, "architecture.sliding_window": window, "architecture.global_every": every}
                      for every in (0, 2))  # mixed: layer 1 global
    full = build(GPT, LLAMA).flops(seq)
    assert build(GPT, sliding).flops(seq) == build(GPT, mixed).flops(seq) == full
    with jax.set_mesh(tpu_mesh({"data": 1})):
        causal = build(GPT, LLAMA).flops(seq)
        assert causal == full - 2 * per_pair * 3 * 256**2
        assert build(GPT, sliding).flops(seq) == causal - 2 * per_pair * 256**2
        assert build(GPT, mixed).flops(seq) == causal - per_pair * 256**2
        assert build(GPT, {**LLAMA, "architecture.sliding_window": seq}).flops(seq) == causal
