"""Runs as data: overrides typed by Hydra's own parser, as a run directory records them."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from theseus.report.records import RunRecord
from theseus.training.run_files import parse_override


@pytest.mark.parametrize("override, parsed", [
    ("+optimizer.lr=1e-3", ("optimizer.lr", 0.001)),
    ("trainer.dry_run=true", ("trainer.dry_run", True)),
    ("architecture.d_ff=null", ("architecture.d_ff", None)),
    ("trainer.max_steps=6", ("trainer.max_steps", 6)),
    ("logger.name=abc", ("logger.name", "abc")),
    ('logger.name="007"', ("logger.name", "007")),  # quoted: a string, as Hydra reads it
    ("logger.tags=[a,b]", ("logger.tags", ["a", "b"])),
    ("+experiment=gpt_tiny", ("experiment", "gpt_tiny")),
    ("~trainer.seed", None),  # a deletion has no value
])
def test_overrides_are_typed_as_hydra_types_them(override, parsed):
    assert parse_override(override) == parsed
    if parsed is not None:
        assert type(parse_override(override)[1]) is type(parsed[1])  # True is no 1, 6 no 6.0


def test_a_runs_params_come_from_its_recorded_overrides(tmp_path):
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save({"trainer": {"batch_size": 4}, "architecture": {"seq_len": 8}}, tmp_path / ".hydra" / "config.yaml")
    OmegaConf.save(["+experiment=gpt_tiny", "trainer.dry_run=false", "optimizer.lr=3e-4", "~trainer.seed"],
                   tmp_path / ".hydra" / "overrides.yaml")
    (tmp_path / "metrics.jsonl").write_text('{"step": 6, "loss": 2.5}\n{"step": 6, "val')  # the last line cut short
    run = RunRecord.load(tmp_path)
    assert run.params == {"experiment": "gpt_tiny", "trainer.dry_run": False, "optimizer.lr": 3e-4}
    assert run.tokens_per_step == 32 and run.series("loss") == ([6], [2.5]) and run.last("val_loss") is None


def test_a_run_stopped_after_its_last_log_is_at_its_checkpoints_step(tmp_path):
    """Ctrl-C at step 12 saves checkpoint 12; the last log was step 10: the run is at step 12."""
    from theseus.report.records import load

    (tmp_path / ".hydra").mkdir()
    OmegaConf.save({"trainer": {"max_steps": 20}}, tmp_path / ".hydra" / "config.yaml")
    (tmp_path / "metrics.jsonl").write_text('{"step": 5, "loss": 3.0}\n{"step": 10, "loss": 2.5}\n')
    for name in ("5", "12", "14.orbax-checkpoint-tmp-1"):  # the last: a save never completed
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    (row,) = load(tmp_path).summary()
    assert (row["step"], row["max_steps"], row["loss"]) == (12, 20, 2.5)
    (tmp_path / "metrics.jsonl").write_text('{"step": 15, "loss": 2.0}\n')  # logged past it: the log's step
    assert RunRecord.load(tmp_path).step == 15
