"""What fits: the changes a dry run compiles for a step that does not fit, in the order it tries
them (the search itself, compiled for a TPU, is tests/plan/test_target.py's)."""

from __future__ import annotations

from theseus.plan.fitting import candidates, text

MiB = 2**20


def changes(**kwargs) -> list[str]:
    options = {"batch_size": 32, "grad_accum": 1, "parallel": 8, "data": 8, "fsdp": 1, "data_given": False,
               "remat": "none", "fixed": 100 * MiB, "temp": 400 * MiB, "limit": 160 * MiB, **kwargs}
    return [text(change) for level in candidates(**options) for change in level]


def test_fewest_knobs_first_each_count_in_the_knobs_order():
    # 100 + 400 / g <= 160 MiB: g >= 6.67, and 32 sequences over 8 devices allow g in 2, 4: the most, 4
    assert changes() == [
        "trainer.grad_accum=4", "mesh.fsdp=8", "architecture.remat=dots", "architecture.remat=full",
        "trainer.grad_accum=4 mesh.fsdp=8", "trainer.grad_accum=4 architecture.remat=dots",
        "trainer.grad_accum=4 architecture.remat=full", "mesh.fsdp=8 architecture.remat=dots",
        "mesh.fsdp=8 architecture.remat=full", "trainer.grad_accum=4 mesh.fsdp=8 architecture.remat=dots",
        "trainer.grad_accum=4 mesh.fsdp=8 architecture.remat=full"]


def test_the_smallest_accumulation_estimated_to_fit_is_tried():
    assert changes(limit=250 * MiB)[0] == "trainer.grad_accum=4"  # 100 + 400 / 2 = 300 > 250
    assert changes(limit=300 * MiB)[0] == "trainer.grad_accum=2"
    assert changes(parallel=4, data=4, limit=160 * MiB)[0] == "trainer.grad_accum=8"  # 32 / 4: g in 2, 4, 8


def test_a_knob_already_turned_as_far_as_it_goes_is_not_offered():
    assert changes(grad_accum=4, data=1, fsdp=8, remat="full") == []  # one sequence a device, sharded, recomputed
    assert changes(grad_accum=4, remat=None) == ["mesh.fsdp=8"]  # a model without architecture.remat
    assert changes(grad_accum=4, remat="dots", data=1, fsdp=8) == ["architecture.remat=full"]


def test_a_data_axis_given_is_folded_into_fsdp_by_name():
    assert changes(grad_accum=4, remat="full", data_given=True, data=4, fsdp=2) == ["mesh.data=1 mesh.fsdp=8"]


def test_changes_come_by_how_many_knobs_they_turn():
    levels = candidates(batch_size=32, grad_accum=1, parallel=8, data=8, fsdp=1, data_given=False, remat="dots",
                        fixed=100 * MiB, temp=400 * MiB, limit=160 * MiB)
    assert [len(level) for level in levels] == [3, 3, 1]  # accum, fsdp, full; their pairs; all three
