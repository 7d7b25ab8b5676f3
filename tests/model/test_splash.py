"""Splash attention (the TPU's default) against theseus's own written-out attention, float32 on
the CPU (the kernel in Pallas's interpreter): outputs and gradients, causal, grouped-query, a
sliding window, packed segments and a soft cap; the pairs its FLOPs count against the kernel's
own block map; ``auto`` choosing it for a TPU's mesh, and compiling there sharded."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support import tpu_mesh
from theseus.base.axis import BATCH_MESH_AXES
from theseus.config import configuration, configure
from theseus.model.layers import Attention
from theseus.model.models.gpt import GPT
from theseus.model.splash import _kernel, block_size, computed_pairs, splash_attention

SEQ = 384  # three blocks of 128: the causal diagonal's partial blocks, and blocks skipped above it
# no biases: a key bias's gradient is zero in exact arithmetic (softmax is blind to a shift), float32
# rounding on both sides
BASE = {"architecture.d_model": 64, "architecture.n_heads": 4, "architecture.init_std": 0.3, "architecture.bias": False}
# float32 through the same arithmetic but for the online softmax's order of sums: every element
# within this fraction of its array's largest magnitude
TOLERANCE = 1e-5


def assert_close(got, expected, what: str) -> None:
    scale = float(np.max(np.abs(expected)))
    assert float(np.max(np.abs(np.asarray(got) - np.asarray(expected)))) <= TOLERANCE * scale, what


def attention(impl: str | None, **keys) -> Attention:
    with configuration({**BASE, **keys, "architecture.attention_impl": impl}):
        return configure(Attention)


CASES = {
    "causal_softcap": {"architecture.attn_softcap": 2.0},
    "gqa_window": {"architecture.n_kv_heads": 2, "architecture.sliding_window": 100,
                   "architecture.positions": "rope"},
    "mqa_segments": {"architecture.n_kv_heads": 1},
}


@pytest.mark.slow
@pytest.mark.parametrize("fused", [False, True], ids=["two_backward_kernels", "fused_backward"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_splash_matches_the_written_out_attention_and_its_gradients(case, fused):
    keys = CASES[case]
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, SEQ, 64)), jnp.float32)
    cotangent = jnp.asarray(rng.standard_normal((2, SEQ, 64)), jnp.float32)
    positions = jnp.arange(SEQ)
    # two packed sequences a row, split at different places (one across a block boundary)
    segments = jnp.asarray(np.stack([np.arange(SEQ) >= 200, np.arange(SEQ) >= 50]).astype(np.int32))
    segments = segments if case.endswith("segments") else None
    written = attention(None, **keys)
    splash = attention("splash", **keys, **{"architecture.splash_fused_backward": fused})
    params = written.init(jax.random.key(1), x, positions)["params"]
    if case.endswith("segments"):
        positions = jnp.where(segments == 0, positions, positions - jnp.asarray([[200], [50]]))

    def loss(layer):
        def f(params, x):
            out = layer.apply({"params": params}, x, positions, segments=segments)
            return jnp.sum(out * cotangent), out
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))

    (_, expected), expected_grads = loss(written)(params, x)
    (_, got), got_grads = loss(splash)(params, x)
    assert_close(got, expected, "output")
    for (path, g), e in zip(jax.tree_util.tree_leaves_with_path(got_grads), jax.tree.leaves(expected_grads),
                            strict=True):
        assert_close(g, e, jax.tree_util.keystr(path))


@pytest.mark.parametrize("seq, window", [(1024, None), (384, None), (384, 100), (640, 300), (256, None)])
def test_the_pairs_counted_are_the_blocks_the_kernels_own_map_computes(seq, window):
    """``computed_pairs`` against the kernel's forward block map (``block_mask``: 0 where a block
    is skipped): causal at 1024 is 3 of 4 blocks of 512."""
    info = _kernel(seq, 1, window, None, False, True).fwd_mask_info
    blocks = int(np.count_nonzero(np.asarray(info.block_mask)))
    assert computed_pairs(seq, window) == blocks * block_size(seq) ** 2
    if (seq, window) == (1024, None):
        assert computed_pairs(seq, window) == 3 * 512 * 512


def test_no_trace_takes_another_traces_kernel():
    """The state's layout is traced (eval_shape) before its init compiles: a kernel kept from the
    first trace carried its tracers into the second (on a TPU: an init compiled for 5 inputs and
    called with none). JAX's leak checker finds any tracer that outlives its trace."""
    q = jnp.ones((1, 128, 1, 32))
    attend = lambda q: splash_attention(q, q, q, None, scale=0.125, interpret=True)  # noqa: E731
    with jax.checking_leaks():
        jax.eval_shape(attend, q)
        out = jax.jit(attend).lower(q).compile()(q)
    np.testing.assert_allclose(out, attend(q), rtol=1e-6)


def test_block_sizes_divide_the_sequence_or_there_is_none():
    assert [block_size(n) for n in (1024, 2048, 768, 384, 128, 100, 1000)] == [512, 512, 256, 128, 128, None, None]


def test_auto_is_splash_on_a_tpu_mesh_and_written_out_on_the_cpu_with_flops_to_match():
    model = attention("auto")
    assert model.kernel(1024) is None and model.attention_pairs(1024) == 1024 * 1024
    with jax.set_mesh(tpu_mesh({"data": 4})):
        assert model.kernel(1024) == "splash" and model.attention_pairs(1024) == 3 * 512 * 512
        assert model.kernel(1000) is None  # no block divides it: written out
        assert model.kernel(512) is None and model.attention_pairs(512) == 512 * 512  # one block: no pair skipped
        assert attention("splash").kernel(512) == "splash"  # asked for by name
        assert attention(None).kernel(1024) is None and attention("xla").kernel(1024) == "xla"
        assert "splash: 0.75 x seq^2" in model.flops_note(1024)
    assert model.flops_note(1024) == "attention written out: seq^2 pairs, masked ones too"


@pytest.mark.slow
def test_a_gpt_step_compiles_for_a_tpu_slice_with_splash_per_device_over_batch_and_heads():
    """Deviceless: a GQA GPT's gradient, batch over data, heads over tensor, compiled by libtpu:
    the kernel runs on each device's share (no all-gather of q, k or v), no [seq, seq] scores."""
    mesh = tpu_mesh({"data": 2, "fsdp": 1, "expert": 1, "tensor": 2})
    cfg = {**BASE, "architecture.vocab_size": 256, "architecture.seq_len": 256, "architecture.n_layers": 1,
           "architecture.n_kv_heads": 2, "architecture.positions": "rope", "architecture.attention_impl": "splash"}
    with configuration(cfg):
        model = configure(GPT)
    rules = model.plan().rules()
    tokens = jax.ShapeDtypeStruct((4, 256), jnp.int32, sharding=jax.NamedSharding(mesh, jax.P(BATCH_MESH_AXES)))
    key = jax.random.key(0)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        params = jax.eval_shape(model.init, key, tokens)["params"]
        grad = jax.jit(jax.grad(lambda p, t: model.apply({"params": p}, t).astype(jnp.float32).mean()))
        text = grad.lower(params, tokens).compile().as_text()
    kernels = {line.split(" = ")[0].strip(): line.split(" custom-call(")[0] for line in text.splitlines()
               if "custom-call(" in line and "splash_mha" in line}
    assert {name.split("_residuals")[0].split("_no")[0] for name in kernels} == {
        "%splash_mha_fwd", "%splash_mha_dkv"}, kernels  # the backward fused (the default): dq in the dkv kernel
    # each device's share: batch 4 over data=2, query heads 4 and kv heads 2 over tensor=2 (head_dim 16)
    assert all("bf16[2,2,256,16]" in result for name, result in kernels.items() if "dkv" not in name), kernels
    assert all("bf16[2,1,256,16]" in result for name, result in kernels.items() if "dkv" in name), kernels
    assert "all-gather" not in text and "256,256]" not in text  # nothing gathered, no scores
    entry = text[text.index("\nENTRY"):]
    entry = entry[:entry.index("\n}")]
    # its inputs are the params and the tokens alone: no tracer of the layout's trace above taken in
    assert entry.count(" parameter(") == len(jax.tree.leaves(params)) + 1


@pytest.mark.slow
@pytest.mark.parametrize("remat, forwards", [("dots", 1), ("full", 2)])
def test_remat_dots_keeps_the_kernels_output_where_full_runs_it_again(remat, forwards):
    """``architecture.remat=dots`` saves splash's output and logsumexp (``ATTENTION_OUTPUT``)
    beside the matrix products: the backward pass runs no second forward kernel; ``full`` does."""
    mesh = tpu_mesh({"data": 1, "fsdp": 1, "expert": 1, "tensor": 1})
    with configuration({**BASE, "architecture.vocab_size": 256, "architecture.seq_len": 256, "architecture.n_layers": 1,
                        "architecture.remat": remat, "architecture.attention_impl": "splash"}):
        model = configure(GPT)
    tokens = jax.ShapeDtypeStruct((2, 256), jnp.int32)
    key = jax.random.key(0)
    with jax.set_mesh(mesh), nn.logical_axis_rules(model.plan().rules()):
        params = jax.eval_shape(model.init, key, tokens)["params"]
        grad = jax.jit(jax.grad(lambda p, t: model.apply({"params": p}, t).astype(jnp.float32).mean()))
        text = grad.lower(params, tokens).compile().as_text()
    assert len(re.findall(r"%splash_mha_fwd\S* = ", text)) == forwards
