"""Where a step's HBM bytes go: each instruction's reads and writes, by hand on a program as a
TPU prints it (partial reads, VMEM, async copies, loops, inherited parts), then on compiled
steps: a small GPT's for the CPU and for a TPU slice, splash against the written-out scores."""

from __future__ import annotations

import pytest

from support import tpu_mesh
from theseus.config.compose import compose
from theseus.model.splash import computed_pairs
from theseus.plan.hlo import Program
from theseus.plan.products import ProductCounter
from theseus.plan.traffic import hbm_bytes_by_part, module_path
from theseus.recipe import assemble, resolve
from theseus.training.parts import Run

MLP = 'metadata={op_name="jit(train_step)/while/body/closed_call/transpose(jvp(GPT))/jit(core_fn)/h_0/mlp/add"}'
UPDATE = 'metadata={op_name="jit(train_step)/optimizer_update/mul"}'
# a TPU's compiled step, in miniature: a loop of 3 around a fusion reading a weight through a
# slice; a weight prefetched into VMEM (S(1)) by an async slice; a layout copy XLA adds (no
# metadata); a Pallas kernel; a gradient all-reduce; the update, in place
HLO = f"""HloModule jit_train_step

%fused_mlp (param_0: f32[64,128], param_1: bf16[8,128]) -> bf16[8,128] {{
  %param_0 = f32[64,128]{{1,0}} parameter(0)
  %param_1 = bf16[8,128]{{1,0}} parameter(1)
  %slice.1 = f32[8,128]{{1,0}} slice(%param_0), slice={{[0:8], [0:128]}}
  %convert.1 = bf16[8,128]{{1,0}} convert(%slice.1)
  ROOT %add.1 = bf16[8,128]{{1,0}} add(%convert.1, %param_1), {MLP}
}}

%body (p: (s32[], bf16[8,128], f32[64,128])) -> (s32[], bf16[8,128], f32[64,128]) {{
  %p = (s32[], bf16[8,128]{{1,0}}, f32[64,128]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = bf16[8,128]{{1,0}} get-tuple-element(%p), index=1
  %w = f32[64,128]{{1,0}} get-tuple-element(%p), index=2
  %fusion.1 = bf16[8,128]{{1,0}} fusion(%w, %x), kind=kLoop, calls=%fused_mlp, {MLP}
  ROOT %t = (s32[], bf16[8,128]{{1,0}}, f32[64,128]{{1,0}}) tuple(%i, %fusion.1, %w)
}}

%cond (q: (s32[], bf16[8,128], f32[64,128])) -> pred[] {{
  %q = (s32[], bf16[8,128]{{1,0}}, f32[64,128]{{1,0}}) parameter(0)
  %n = s32[] constant(3)
  %j = s32[] get-tuple-element(%q), index=0
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}}

ENTRY %main (w0: f32[64,128], x0: bf16[8,128]) -> f32[64,128] {{
  %w0 = f32[64,128]{{1,0}} parameter(0), metadata={{op_name="state.params['h_0']['mlp']['w_up']"}}
  %x0 = bf16[8,128]{{1,0}} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[8,128]{{1,0}}, f32[64,128]{{1,0}}) tuple(%zero, %x0, %w0)
  %loop = (s32[], bf16[8,128]{{1,0}}, f32[64,128]{{1,0}}) while(%init), condition=%cond, body=%body
  %y = bf16[8,128]{{1,0}} get-tuple-element(%loop), index=1
  %prefetch = ((f32[64,128]{{1,0}}), f32[8,128]{{1,0:S(1)}}, s32[]{{:S(2)}}) slice-start(%w0), slice={{[0:8], [0:128]}}
  %prefetched = f32[8,128]{{1,0:S(1)}} slice-done(%prefetch)
  %splash_mha_fwd.1 = (bf16[8,128]{{1,0}}, f32[8,128]{{1,0:S(1)}}) custom-call(%y, %x0, %x0)
  %out = bf16[8,128]{{1,0}} get-tuple-element(%splash_mha_fwd.1), index=0
  %copy.7 = bf16[8,128]{{0,1}} copy(%out)
  %grads = f32[64,128]{{1,0}} all-reduce(%w0), channel_id=1, to_apply=%add
  ROOT %update = f32[64,128]{{1,0}} multiply(%grads, %w0), {UPDATE}
}}
"""


def test_each_instruction_counts_its_reads_and_writes_through_hbm_as_often_as_it_runs():
    w, x, row = 64 * 128 * 4, 8 * 128 * 2, 8 * 128 * 4  # the weight, the activation, a float32 row block
    assert Program.parse(HLO).runs(control_only=True) == {"fused_mlp": 0, "body": 3, "cond": 3, "main": 1}
    assert hbm_bytes_by_part(HLO) == {
        "MLP": 3 * (row + 2 * x),  # the fusion reads the weight's slice and x and writes x, 3 times
        "async copies to and from VMEM": row,  # read once from HBM into VMEM; its -done moves nothing
        # the kernel's operands and its HBM result (not its VMEM one); the layout copy after it (no
        # metadata) is its producer's
        "attention scores and values": 3 * x + x + 2 * x,
        "collectives": 2 * w,
        "optimizer update": 3 * w,
        "other": 3 * (4 + 4 + 1),  # the loop's condition: its counter and bound read, a pred written, 3 times
    }


def test_module_paths_drop_transformations_layers_einsums_and_the_primitive():
    assert module_path("jit(train_step)/while/body/closed_call/transpose(jvp(GPT))/jit(core_fn)/h_11/attn/"
                       "attention_scores/shard_map/transpose") == ("h", "attn", "attention_scores", "shard_map")
    assert module_path("jit(train_step)/while/body/closed_call/jvp(GPT)/wte.attend/ad,vd->av/dot_general") == (
        "wte.attend",)
    assert module_path("jit(train_step)/jit(_where)/select_n") == ()


def planned(*overrides: str) -> Run:
    """A dry run's compiled step of a 2-layer GPT (seq 1024, d_model 256, 16 sequences)."""
    return assemble(resolve(compose(["+experiment=gpt_tiny", "trainer.dry_run=true", "architecture.seq_len=1024",
                                     "architecture.d_model=256", "trainer.batch_size=16", "trainer.grad_accum=1",
                                     *overrides])), announce=False)


def traffic(run: Run) -> tuple[dict, float]:
    """The run's step's traffic by part, and XLA's bytes accessed."""
    return hbm_bytes_by_part(run.compiled.step.as_text()), float(run.compiled.step.cost_analysis()["bytes accessed"])


@pytest.mark.slow
def test_a_cpu_step_s_traffic_is_xla_s_count_and_named_by_part():
    parts, xla = traffic(planned("mesh.cpu_devices=1", "architecture.seq_len=256", "trainer.batch_size=8"))
    assert {"attention scores and values", "attention projections", "MLP", "norms", "logits: output head",
            "logits: cross-entropy", "optimizer update", "embeddings", "residual stream"} <= parts.keys()
    assert sum(parts.values()) == pytest.approx(xla, rel=0.05)  # no VMEM, no async copies: XLA's count


@pytest.fixture(scope="module")
def on_a_tpu() -> dict[str, Run]:
    """The step planned for a TPU v5e-4 (4 sequences a chip), its attention written out and splash."""
    tpu_mesh({"data": 1})  # skipped without libtpu
    return {impl: planned("mesh.target=tpu:v5e-4", f"architecture.attention_impl={impl}") for impl in ("null", "auto")}


@pytest.mark.slow
def test_on_a_tpu_splash_moves_a_fraction_of_the_written_out_scores_bytes(on_a_tpu):
    """Written out, the [seq, seq] scores of a chip's 4 sequences (64 MiB a layer in float32)
    go through HBM; splash keeps them in VMEM. The async copies are counted once, where XLA's
    count repeats them (and counts arrays in VMEM): it is the larger."""
    (written, written_xla), (splash, _) = traffic(on_a_tpu["null"]), traffic(on_a_tpu["auto"])
    assert splash["attention scores and values"] < 0.05 * written["attention scores and values"]
    assert sum(written.values()) < written_xla


@pytest.mark.slow
def test_on_a_tpu_the_flops_count_is_xla_s_with_the_kernel_as_it_computes(on_a_tpu):
    """Written out, XLA's count of the TPU's program within 5% of ``flops``; with splash, XLA
    counts nothing inside the kernel: with the pairs it computes (3 of 4 blocks of 512), too. The
    planner's products (``theseus.plan.products``) are theseus's count exactly, the kernel's aside."""
    written, splash = on_a_tpu["null"], on_a_tpu["auto"]
    assert written.compiled.xla_flops == pytest.approx(written.flops_per_step, rel=0.05)
    kernel = 2 * 12 * 256 * computed_pairs(1024, None) * 16  # layers x 12 x heads x head_dim x pairs x sequences
    assert splash.flops_per_step == written.flops_per_step - 2 * 12 * 256 * (1024**2 - 3 * 512**2) * 16
    assert splash.compiled.xla_flops + kernel == pytest.approx(splash.flops_per_step, rel=0.05)
    for run, unseen in ((written, 0), (splash, kernel)):  # the planner's products, read from each device's program
        program = Program.parse(run.compiled.step.as_text())
        count = ProductCounter(program, None)
        seen = sum(count(i).flops * times for i, times in program.instructions(control_only=True))
        assert seen * len(run.devices) == run.flops_per_step - unseen  # exactly: the kernel's are all it misses


def test_a_loop_writing_its_slot_of_a_stacked_buffer_moves_the_slot_not_the_buffer():
    """A scan's outputs (as a scanned model's stacked activations) are written in place, a row a
    trip: the traffic grows with the trips, not with trips x the whole buffer."""
    import jax
    import jax.numpy as jnp

    trips, width = 64, 4096

    def scanned(x):
        def body(carry, _):
            carry = jnp.tanh(carry)
            return carry, carry
        return jax.lax.scan(body, x, None, length=trips)

    hlo = jax.jit(scanned).lower(jnp.ones(width)).compile().as_text()
    row = width * 4
    moved = sum(hbm_bytes_by_part(hlo).values())
    assert trips * row <= moved <= 8 * trips * row  # a row read and written, a slot written, per trip
    assert moved < trips * trips * row / 4  # the buffer's bytes each trip would be 64x a row's
