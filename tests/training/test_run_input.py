"""Bad input to a run's start, as a user meets it: one line, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from support import run_python


def refused(tmp_path, *overrides: str) -> list[str]:
    run_dir = tmp_path / "run"
    proc = run_python("-m", "theseus.run", "+experiment=gpt_tiny", "logger.mode=disabled", *overrides,
                      f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert not run_dir.exists()
    return proc.stderr.strip().splitlines()


@pytest.mark.slow
def test_resume_from_a_folder_without_checkpoints(tmp_path):
    assert refused(tmp_path, "trainer.resume=/etc") == [
        "theseus: error: trainer.resume=/etc is not a checkpoint: give a run directory with checkpoints/, its "
        "checkpoints/ folder or one step's folder (or auto, last, never)"]


@pytest.mark.slow
def test_init_from_a_folder_without_weights(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "n_positions": 64}))
    [line] = refused(tmp_path, f"trainer.init_from={folder}")
    assert line.startswith(f"theseus: error: trainer.init_from={folder}: {folder} has neither model.safetensors")


@pytest.mark.slow
def test_a_step_that_does_not_fit_is_refused_before_the_run(tmp_path):
    """The step's memory (XLA's analysis) against the device's, here trainer.memory_limit: 8 MiB,
    more than gpt_tiny's parameters, optimizer state and batch, less than its activations."""
    compiling, line = refused(tmp_path, f"trainer.memory_limit={8 * 2**20}")  # XLA's analysis needs the compile
    assert compiling == "theseus: compiling GPT's train step for 2 cpu devices (data=2)"
    assert line.startswith("theseus: error: the step needs ")
    assert "per device, more than the 8 MiB of the device (trainer.memory_limit): set trainer.grad_accum=" in line
    accum = int(line.split("trainer.grad_accum=")[1].split()[0])
    assert accum > 1 and 16 % accum == 0  # gpt_tiny's batch of 16 splits into that many micro-batches
