"""logger.tensorboard=true: event files beside W&B, read back with TensorBoard's own reader;
the job's overrides as HParams (what the HParams dashboard shows of a sweep)."""

from __future__ import annotations

import json

import pytest
from support import run_python

from theseus.training.tensorboard import TensorBoard


def read(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(folder))
    events.Reload()
    hparams = {tag: plugin_data_pb2.HParamsPluginData.FromString(content)
               for tag, content in events.PluginTagToContent("hparams").items()}
    return events, hparams


def test_scalars_and_a_session_that_ends_only_on_success(tmp_path):
    for failed in (False, True):
        board = TensorBoard(tmp_path / str(failed), {"optimizer.lr": 0.003, "experiment": "gpt_tiny"})
        board.log(5, {"train/loss": 2.5, "val/loss": float("nan")})
        board.log(10, {"train/loss": 2.25})
        board.close(failed=failed)
        events, hparams = read(tmp_path / str(failed) / "tensorboard")
        assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(5, 2.5), (10, 2.25)]
        assert "val/loss" not in events.Tags()["scalars"]  # NaN left out
        start = hparams["_hparams_/session_start_info"].session_start_info.hparams
        assert start["optimizer.lr"].number_value == 0.003 and start["experiment"].string_value == "gpt_tiny"
        experiment = hparams["_hparams_/experiment"].experiment
        assert [m.name.tag for m in experiment.metric_infos] == ["val/loss", "train/loss"]
        assert ("_hparams_/session_end_info" in hparams) is not failed


@pytest.mark.slow
def test_a_run_writes_tensorboard_beside_wandb(tmp_path):
    result = run_python("-m", "theseus.run", "+experiment=gpt_tiny", "trainer.max_steps=4", "trainer.log_every=2",
                        "logger.tensorboard=true", "optimizer.lr=0.002", "hydra.run.dir=run", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    events, hparams = read(tmp_path / "run" / "tensorboard")
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [(row["step"], row["loss"]) for row in logged if "loss" in row]
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(s, pytest.approx(v, rel=1e-6)) for s, v in losses]
    val = [row["val_loss"] for row in logged if "val_loss" in row]
    assert [e.value for e in events.Scalars("val/loss")] == [pytest.approx(v, rel=1e-6) for v in val]
    assert {"throughput/mfu", "optim/lr"} <= set(events.Tags()["scalars"])
    start = hparams["_hparams_/session_start_info"].session_start_info.hparams
    assert start["optimizer.lr"].number_value == 0.002 and start["trainer.max_steps"].number_value == 4
    assert "_hparams_/session_end_info" in hparams
    assert (tmp_path / "run" / "wandb").is_dir()  # W&B still logs (offline, the default)
