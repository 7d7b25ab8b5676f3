"""The training loop: a log line's metrics are means over its log window, pauses are not step
time, cadence is a list of hooks that a subclass extends, and a loop that fails finishes the save
in flight."""

from __future__ import annotations

import json
import math
import time

import jax.numpy as jnp
import pytest

from theseus.config.compose import compose
from theseus.training.loop import LogWindow, LoopState
from theseus.recipe import assemble, resolve
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


def logged(tmp_path, name: str, trainer_cls: type[Trainer], *overrides: str) -> tuple[Trainer, dict[int, dict]]:
    run_dir = tmp_path / name
    cfg = compose([*TINY, f"data.cache_dir={tmp_path / 'cache'}", *overrides])
    trainer = trainer_cls(assemble(resolve(cfg, run_dir)))
    trainer.run(run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return trainer, {row["step"]: row for row in rows if "loss" in row}


@pytest.mark.slow
def test_a_log_lines_metrics_are_means_over_its_window_and_hooks_plug_in(tmp_path):
    """A mixture of experts logged every step and every 4: each metric of a window's line is the
    mean of its steps' (loss, lm_loss, the routing), lr and grad_norm its last step's, so that in
    every line loss = lm_loss + aux_loss x 0.01 + z_loss x 0.001 (the README's coefficients)."""
    moe = ("model=moe", "architecture.moe.n_experts=4")
    _, every_step = logged(tmp_path, "every", Trainer, "trainer.log_every=1", *moe)
    trainer, windows = logged(tmp_path, "windows", Profiled, "trainer.log_every=4", *moe)
    assert list(every_step) == [1, 2, 3, 4, 5, 6] and list(windows) == [4, 6]  # the last step closes a window
    for end, steps in ((4, (1, 2, 3, 4)), (6, (5, 6))):
        for key in ("loss", "lm_loss", "moe/aux_loss", "moe/z_loss", "moe/load_e0"):
            assert windows[end][key] == pytest.approx(sum(every_step[s][key] for s in steps) / len(steps), rel=1e-6)
        for key in ("lr", "grad_norm"):
            assert windows[end][key] == pytest.approx(every_step[end][key], rel=1e-6)
    for row in (*every_step.values(), *windows.values()):
        penalty = 0.01 * row["moe/aux_loss"] + 0.001 * row["moe/z_loss"]
        assert row["loss"] == pytest.approx(row["lm_loss"] + penalty, rel=1e-6)
    assert windows[4]["lm_loss"] != pytest.approx(every_step[4]["lm_loss"], rel=1e-6)  # not the window's last step
    assert trainer.seen == [2, 4, 6]


def test_a_windows_step_time_leaves_out_its_pauses():
    window = LogWindow()
    window.add({"loss": jnp.float32(1.0), "lr": jnp.float32(0.25)}, waited=0.01)
    with window.pause():
        time.sleep(0.3)
    window.add({"loss": jnp.float32(2.0), "lr": jnp.float32(0.5)}, waited=0.03)
    metrics = window.close()
    assert metrics["loss"] == 1.5 and metrics["lr"] == 0.5 and math.isclose(metrics["data_wait"], 0.02)
    assert 0 <= metrics["step_time"] < 0.05
    window.add({"loss": jnp.float32(3.0)}, waited=0.0)
    with window.pause():  # the log hook closes a window inside the hooks' pause
        assert window.close()["loss"] == 3.0  # the fetch before it is step time; what follows is not
        time.sleep(0.3)
    window.add({"loss": jnp.float32(4.0)}, waited=0.0)
    assert 0 <= window.close()["step_time"] < 0.05


def test_a_window_counts_its_finished_steps_without_waiting_for_them():
    """The loop dispatches steps ahead of the device: ``finished`` asks each step's metrics
    whether they are ready, and does not wait for one that is not."""
    import jax

    @jax.jit
    def slow(x):  # a second or more of work on a CPU
        return jax.lax.fori_loop(0, 60, lambda _, y: jnp.tanh(y @ y), x).sum()

    x = jnp.ones((1024, 1024)) / 1024
    slow(x).block_until_ready()  # compiled
    window = LogWindow()
    window.add({"loss": jnp.float32(1.0)}, waited=0.0)
    window.steps[0]["loss"].block_until_ready()
    pending = slow(x)
    window.add({"loss": pending}, waited=0.0)
    began = time.perf_counter()
    assert window.finished() == 1 and time.perf_counter() - began < 0.05  # the first has run; the second is asked, not awaited
    pending.block_until_ready()
    assert window.finished() == 2
    window.close()
    assert window.finished() == 0  # a new window


class FailsAfterASave(Trainer):
    """A trainer whose own hook fails on the step a checkpoint was saved at."""

    def hooks(self):
        return [*super().hooks(), self.fail]

    def fail(self, loop: LoopState) -> None:
        if loop.step == 4:
            self.checkpointer = loop.checkpointer
            raise RuntimeError("a hook of the user's failed")


@pytest.mark.slow
def test_a_save_in_flight_when_the_loop_fails_is_finished_and_its_writer_closed(tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose([*TINY, f"data.cache_dir={tmp_path / 'cache'}", "trainer.checkpoint_every=4",
                   "trainer.checkpoint_writer=process"])
    trainer = FailsAfterASave(assemble(resolve(cfg, run_dir)))
    with pytest.raises(RuntimeError, match="a hook of the user's failed"):
        trainer.run(run_dir)
    assert trainer.checkpointer.writer.process is None  # closed: the writer finished and exited
    assert [path.name for path in (run_dir / "checkpoints").iterdir()] == ["4"]  # whole: no temporary folder
