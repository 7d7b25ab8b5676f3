"""The training loop: the logged loss is the mean over its log window, pauses are not step
time, and cadence is a list of hooks that a subclass extends."""

from __future__ import annotations

import json
import math
import time

import jax.numpy as jnp
import pytest

from theseus.config.compose import compose
from theseus.training.loop import LogWindow, LoopState
from theseus.recipe import assemble
from theseus.training.trainer import Trainer

TINY = ["+experiment=gpt_tiny", "trainer.max_steps=6", "trainer.eval_every=0", "trainer.eval_batches=1",
        "trainer.checkpoint_every=0", "logger.mode=disabled", "architecture.dropout=0.1"]


class Profiled(Trainer):
    """A trainer with one more hook, as a profiler or an extra evaluation would add it."""

    def hooks(self):
        self.seen: list[int] = []
        return [*super().hooks(), self.every_other_step]

    def every_other_step(self, loop: LoopState) -> None:
        if loop.due(2):
            self.seen.append(loop.step)


def losses(tmp_path, name: str, trainer_cls: type[Trainer], *overrides: str) -> tuple[Trainer, dict[int, float]]:
    run_dir = tmp_path / name
    trainer = trainer_cls(assemble(compose([*TINY, f"data.cache_dir={tmp_path / 'cache'}", *overrides]), run_dir))
    trainer.run(run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return trainer, {row["step"]: row["loss"] for row in rows if "loss" in row}


@pytest.mark.slow
def test_the_logged_loss_is_the_mean_over_the_log_window_and_hooks_plug_in(tmp_path):
    _, every_step = losses(tmp_path, "every", Trainer, "trainer.log_every=1")
    trainer, windows = losses(tmp_path, "windows", Profiled, "trainer.log_every=4")
    assert list(every_step) == [1, 2, 3, 4, 5, 6] and list(windows) == [4, 6]  # the last step closes a window
    assert windows[4] == pytest.approx(sum(every_step[s] for s in (1, 2, 3, 4)) / 4, rel=1e-6)
    assert windows[6] == pytest.approx((every_step[5] + every_step[6]) / 2, rel=1e-6)
    assert windows[4] != pytest.approx(every_step[4], rel=1e-6)  # not the window's last step
    assert trainer.seen == [2, 4, 6]


def test_a_windows_step_time_leaves_out_its_pauses():
    window = LogWindow()
    window.add(jnp.float32(1.0), waited=0.01)
    with window.pause():
        time.sleep(0.3)
    window.add(jnp.float32(2.0), waited=0.03)
    metrics = window.close({"lr": jnp.float32(0.5)})
    assert metrics["loss"] == 1.5 and metrics["lr"] == 0.5 and math.isclose(metrics["data_wait"], 0.02)
    assert 0 <= metrics["step_time"] < 0.05
    window.add(jnp.float32(3.0), waited=0.0)
    with window.pause():  # the log hook closes a window inside the hooks' pause
        assert window.close({})["loss"] == 3.0  # the fetch before it is step time; what follows is not
        time.sleep(0.3)
    window.add(jnp.float32(4.0), waited=0.0)
    assert 0 <= window.close({})["step_time"] < 0.05
