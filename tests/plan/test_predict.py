"""The roofline's collective bytes read from compiled HLO: each collective counted once per run
of the computation it is in, through nested loops (micro-batches around a scan over layers)."""

from __future__ import annotations

from theseus.plan.predict import collective_bytes

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
