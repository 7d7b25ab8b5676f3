"""The predicted step: collective bytes read from compiled HLO, each collective counted once per
run of the computation it is in, through nested loops (micro-batches around a scan over layers);
each instruction's roofline by hand on small programs; products' FLOPs against XLA's count."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

from theseus.plan.hlo import Program
from theseus.plan.predict import KERNEL_STEP_S, Hardware, collective_bytes, predict
from theseus.plan.products import ProductCounter

# the shape of a step with trainer.grad_accum=2 around a 3-layer scan, as XLA prints it compiled
HLO = """HloModule jit_train_step, entry_computation_layout={(f32[16,16]{1,0})->f32[2,16]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%layer_body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p = (s32[], f32[8,16]{1,0}) parameter(0)
  %w = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %gathered = f32[64,16]{1,0} all-gather(f32[8,16]{1,0} %w), channel_id=1, dimensions={0}
  %fused = f32[8,16]{1,0} fusion(%gathered), kind=kLoop, calls=%fused_computation
  ROOT %t = (s32[], f32[8,16]{1,0}) tuple(%i, %fused)
}

%layer_cond (p: (s32[], f32[8,16])) -> pred[] {
  %n = s32[]{:T(128)} constant(3)
  %p = (s32[], f32[8,16]{1,0}) parameter(0)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%micro_body (q: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %q = (s32[], f32[8,16]{1,0}) parameter(0)
  %layers = (s32[], f32[8,16]{1,0}) while(%q), condition=%layer_cond, body=%layer_body, backend_config={"known_induction_variable":{"tuple_index":"0"},"known_trip_count":{"n":"3"}}
  %grads = (f32[4]{0}, f32[], /*index=2*/f32[16]{0}) all-reduce(%a, %b, %c), channel_id=2, to_apply=%add
  ROOT %r = (s32[], f32[8,16]{1,0}) tuple(%j, %g)
}

%micro_cond (q: (s32[], f32[8,16])) -> pred[] {
  %q = (s32[], f32[8,16]{1,0}) parameter(0)
  ROOT %lt = pred[] compare(%j, %m), direction=LT
}

ENTRY %main (x: f32[16,16]) -> f32[2,16] {
  %x = f32[16,16]{1,0} parameter(0)
  %micro = (s32[], f32[8,16]{1,0}) while(%init), condition=%micro_cond, body=%micro_body, backend_config={"known_trip_count":{"n":"2"}}
  %start = f32[2,16]{1,0} reduce-scatter-start(f32[16,16]{1,0} %x), channel_id=3, dimensions={0}, to_apply=%add
  ROOT %done = f32[2,16]{1,0} reduce-scatter-done(%start)
}
"""


def test_collectives_count_once_per_iteration_of_every_loop_around_them():
    gather = 64 * 16 * 4 * 3 * 2  # its result, once per layer of each micro-batch
    reduce = 2 * (4 + 1 + 16) * 4 * 2  # all-reduce sends twice the tuple, once per micro-batch
    scatter = 16 * 16 * 4  # its operand, once; its -done is no second collective
    assert collective_bytes(HLO) == gather + reduce + scatter


def test_without_xla_s_trip_count_a_loop_runs_as_often_as_its_condition_bounds_it_else_once():
    unknown = HLO.replace(',"known_trip_count":{"n":"3"}', "")  # as TPU HLO prints loops
    assert collective_bytes(unknown) == collective_bytes(HLO)  # i < 3
    unbounded = unknown.replace("%n = s32[]{:T(128)} constant(3)", "%n = s32[] parameter(1)")
    assert collective_bytes(unbounded) == 64 * 16 * 4 * 2 + 2 * (4 + 1 + 16) * 4 * 2 + 16 * 16 * 4


# one product and one add, as a device runs them: x [64, 64] @ w [64, 256], then + c
TWO = """HloModule jit_step

%fused_add (a: f32[64,256], b: f32[64,256]) -> f32[64,256] {
  %a = f32[64,256]{1,0} parameter(0)
  %b = f32[64,256]{1,0} parameter(1)
  ROOT %sum = f32[64,256]{1,0} add(%a, %b)
}

ENTRY %main (x: f32[64,64], w: f32[64,256], c: f32[64,256]) -> f32[64,256] {
  %x = f32[64,64]{1,0} parameter(0)
  %w = f32[64,256]{1,0} parameter(1)
  %c = f32[64,256]{1,0} parameter(2)
  %dot = f32[64,256]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %add = f32[64,256]{1,0} fusion(%dot, %c), kind=kLoop, calls=%fused_add
}
"""
# splash's three kernels over 2 sequences of 1024 positions, 4 query heads and 2 kv heads of 64
# dimensions; their results in VMEM (S(1)): each reads q and k from HBM
SPLASH = """HloModule jit_step

ENTRY %main (q: bf16[2,4,1024,64], k: bf16[2,2,1024,64]) -> bf16[2,2,1024,64] {
  %q = bf16[2,4,1024,64]{3,2,1,0} parameter(0)
  %k = bf16[2,2,1024,64]{3,2,1,0} parameter(1)
  %splash_mha_fwd_residuals.1 = bf16[2,4,1024,64]{3,2,1,0:S(1)} custom-call(%q, %k)
  %splash_mha_dq_no_residuals.1 = bf16[2,4,1024,64]{3,2,1,0:S(1)} custom-call(%q, %k)
  ROOT %splash_mha_dkv_no_residuals.1 = bf16[2,2,1024,64]{3,2,1,0:S(1)} custom-call(%q, %k)
}
"""


def compiled(hlo: str) -> SimpleNamespace:
    return SimpleNamespace(as_text=lambda: hlo, cost_analysis=lambda: {})


def test_each_instruction_takes_the_longer_of_its_products_on_the_unit_s_tiles_and_its_bytes():
    hardware = Hardware(rate=1e12, width=128, bandwidth=1e11, interconnect=1e9)
    p = predict(compiled(TWO), hardware, flops_per_device=2 * 64 * 256 * 64)
    product = 2 * 64 * 256 * 64 / 0.5 / 1e12  # 64 contracted dimensions fill half of a 128-wide unit
    assert product > (64 * 64 + 2 * 64 * 256) * 4 / 1e11  # its bytes take less: compute-bound
    add = 3 * 64 * 256 * 4 / 1e11  # two operands read, one result written; no product
    assert (p.compute_s, p.memory_s, p.kernel_steps, p.collective_s) == (pytest.approx(product), pytest.approx(add),
                                                                          0, 0)
    assert p.step_s == pytest.approx(product + add) and p.bound == "compute"
    assert p.flops == 2 * 64 * 256 * 64 and p.accessed == (64 * 64 + 5 * 64 * 256) * 4
    unpadded = predict(compiled(TWO), Hardware(1e12, None, 1e11, 1e9), flops_per_device=0)  # a GPU: no tiles
    assert unpadded.compute_s == pytest.approx(product / 2)


def test_splash_kernels_take_the_flops_xla_cannot_see_as_they_compute_them_and_their_grid_steps():
    """The count's 6 products a (query, key) pair are the kernels' 9 (2 forward, 3 dq, 4 dkv: the
    backward recomputes the scores twice), each filling half of the unit (64 head dimensions)."""
    pairs = 3 * 512**2  # causal over 1024 positions in blocks of 512: 3 of the 4 blocks
    one = 2 * pairs * 64 * 4 * 2  # one product over every pair, head and sequence
    p = predict(compiled(SPLASH), Hardware(1e12, 128, 1e12, 1e9), flops_per_device=6 * one)
    assert p.flops == 9 * one and p.compute_s == pytest.approx(9 * one / 0.5 / 1e12) and p.memory_s == 0
    assert p.kernel_steps == 3 * 2 * 4 * 2 * 2  # 3 kernels x sequences x heads x query blocks x key blocks
    assert p.kernel_steps_s == pytest.approx(p.kernel_steps * KERNEL_STEP_S)
    assert p.accessed == 3 * (2 * 4 + 2 * 2) * 1024 * 64 * 2  # each reads q and k
    no_dq = "\n".join(line for line in SPLASH.splitlines() if "splash_mha_dq" not in line)  # the dkv kernel's
    fused = predict(compiled(no_dq), Hardware(1e12, 128, 1e12, 1e9), flops_per_device=6 * one)
    assert fused.flops == 7 * one and fused.kernel_steps == 2 * 2 * 4 * 2 * 2  # 2 forward, 5 in the fused backward


def test_products_read_from_the_hlo_are_xla_s_count_of_them():
    """Per-head products, a padded, strided and dilated convolution, a batched product: compiled
    for the CPU, their FLOPs from the shapes in the HLO are XLA's own count."""
    def products(x, w, kernel, v):
        heads = jnp.einsum("bsd,dhk->bshk", x, w)
        conv = jax.lax.conv_general_dilated(x.transpose(0, 2, 1), kernel, window_strides=(2,), padding=[(3, 2)],
                                            rhs_dilation=(2,))
        return heads, conv, jnp.einsum("bqhk,bkhd->bhqd", heads, v)

    step = jax.jit(products).lower(jnp.ones((2, 32, 48)), jnp.ones((48, 3, 16)), jnp.ones((24, 48, 5)),
                                   jnp.ones((2, 16, 3, 8))).compile()
    program = Program.parse(step.as_text())
    count = ProductCounter(program, None)
    assert sum(count(i).flops * times for i, times in program.instructions(control_only=True)) == (
        step.cost_analysis()["flops"])
