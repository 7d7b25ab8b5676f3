"""A LoRA run from the command line: the base stays bit for bit, the adapters train, and a run
resumed from its checkpoint continues bit for bit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from support import read_param_paths
from training.test_checkpoint import losses, run

pytestmark = pytest.mark.slow  # real runs in subprocesses


def command(corpus: Path, run_dir: Path, *extra: str) -> list[str]:
    """gpt_tiny with adapters on every projection (dropout on theirs), weight decay on, 4 steps."""
    return [sys.executable, "-m", "theseus.run", "+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}",
            f"data.cache_dir={corpus.parent / 'cache'}", "trainer.max_steps=4", "trainer.log_every=1",
            "trainer.eval_every=4", "trainer.eval_batches=1", "trainer.checkpoint_every=2", "logger.mode=disabled",
            "architecture.lora.rank=4", "architecture.lora.dropout=0.1", "architecture.lora.targets=[q,k,v,o,up,down]",
            "optimizer.weight_decay=0.5", "optimizer.warmup_steps=0", f"hydra.run.dir={run_dir}", *extra]


def test_a_lora_run_trains_its_adapters_alone_and_resumes_bit_for_bit(corpus, tmp_path):
    straight, resumed_run = tmp_path / "straight", tmp_path / "resumed"
    run(command(corpus, straight))
    first, last = (read_param_paths(straight / "checkpoints" / str(step) / "state") for step in (2, 4))
    assert any("/lora_" in path for path in last)
    for path, value in last.items():
        assert np.array_equal(value, first[path]) != ("/lora_" in path), path  # the base frozen, adapters moving

    run(command(corpus, resumed_run, f"trainer.resume={straight / 'checkpoints' / '2'}"))
    assert losses(resumed_run) == {3: losses(straight)[3], 4: losses(straight)[4]}
    resumed = read_param_paths(resumed_run / "checkpoints" / "4" / "state")
    for path, value in last.items():
        np.testing.assert_array_equal(resumed[path], value, err_msg=path)


def test_a_lora_run_from_a_theseus_run_saves_its_adapters_and_resumes_on_that_base(corpus, tmp_path):
    """A LoRA run with trainer.init_from a run of the same model (no adapters): its checkpoints
    hold the adapters and name the step it started from; resumed, it continues bit for bit."""
    source, straight, resumed_run = tmp_path / "source", tmp_path / "straight", tmp_path / "resumed"
    plain = [arg for arg in command(corpus, source) if not arg.startswith("architecture.lora")]
    run([*plain[:plain.index("trainer.max_steps=4")], "trainer.max_steps=2",
         *plain[plain.index("trainer.max_steps=4") + 1:]])
    start = f"trainer.init_from={source}"
    proc = run(command(corpus, straight, start))
    assert f"starting from the weights of {source / 'checkpoints' / '2'} (LoRA's adapters fresh)" in proc.stdout + proc.stderr
    saved = read_param_paths(straight / "checkpoints" / "4" / "state")
    assert saved and all("/lora_" in path for path in saved), sorted(saved)
    record = json.loads((straight / "checkpoints" / "4" / "base" / "metadata").read_text())
    assert record["folder"] == str(source / "checkpoints" / "2")

    run(command(corpus, resumed_run, start, f"trainer.resume={straight / 'checkpoints' / '2'}"))
    assert losses(resumed_run) == {3: losses(straight)[3], 4: losses(straight)[4]}
    resumed = read_param_paths(resumed_run / "checkpoints" / "4" / "state")
    for path, value in saved.items():
        assert resumed[path].tobytes() == value.tobytes(), path
