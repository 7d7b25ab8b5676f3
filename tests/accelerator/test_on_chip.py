"""Everything a user runs, on the attached TPU or GPU, each command as typed in a folder of its
own: the main job (with no variable set, and no logged window after a checkpoint more than 10%
off the median), a resume bitwise equal to the run it continues, losses within bf16's tolerance
of the CPU's, every task (lm, sft, LoRA, dpo, grpo) a few steps, sample and ``--chat``,
evaluate and export.

    python -m pytest tests/accelerator -p no:xdist -v       # over 10 minutes on one TPU v5e (13 host cores)

On a machine whose calls are limited to 10 minutes, run it in parts (``-k main_job``, ``-k every_task``,
``-k agree``): each test's commands hold the chip one at a time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT, run_python

pytestmark = pytest.mark.slow


def on_chip(*args: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python ARGS`` on the accelerator (no JAX_PLATFORMS, no CPU-only XLA flags); it must succeed."""
    env = {key: value for key, value in os.environ.items() if key not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stderr[-4000:]}"
    return proc


def windows(run_dir: Path) -> list[dict]:
    return [row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in row]


def test_the_main_job_runs_as_typed_and_a_checkpoint_costs_the_steps_around_it_nothing(tmp_path):
    on_chip("-m", "theseus.run", "+experiment=gpt_small", "hydra.run.dir=main", cwd=tmp_path)
    logged = windows(tmp_path / "main")
    assert [row["step"] for row in logged] == list(range(10, 301, 10))
    assert json.loads((tmp_path / "main" / "metrics.jsonl").read_text().splitlines()[-1])["val_loss"] < 2.4
    throughput = [row["tokens_per_s"] for row in logged[1:]]  # the first window holds the first step's run
    median = statistics.median(throughput)
    off = {row["step"]: round(row["tokens_per_s"] / median, 2) for row in logged[1:]
           if abs(row["tokens_per_s"] / median - 1) > 0.10}
    assert not off, f"windows more than 10% off the median {median:,.0f} tokens/s (checkpoints every 50): {off}"


def test_a_resumed_run_continues_bitwise(tmp_path):
    tiny = ["-m", "theseus.run", "+experiment=gpt_tiny", "trainer.log_every=5", "trainer.eval_every=0",
            "optimizer.schedule=constant", "logger.mode=disabled"]  # a constant rate: a run extends in place
    on_chip(*tiny, "trainer.max_steps=30", "hydra.run.dir=straight", cwd=tmp_path)
    on_chip(*tiny, "trainer.max_steps=15", "hydra.run.dir=resumed", cwd=tmp_path)
    on_chip(*tiny, "trainer.max_steps=30", "hydra.run.dir=resumed", cwd=tmp_path)  # resume=auto: from step 15
    straight, resumed = windows(tmp_path / "straight"), windows(tmp_path / "resumed")
    assert [r["loss"] for r in straight[3:]] == [r["loss"] for r in resumed[3:]]  # steps 20..30, to the last bit


AGREE = {  # run -> (overrides, relative tolerance of each logged window's mean loss)
    "gpt_tiny": (["+experiment=gpt_tiny", "trainer.max_steps=40", "trainer.log_every=10"], 0.02),
    # the main job's shape over 200 steps: bf16's roundings compound over the updates
    "gpt_small": (["+experiment=gpt_small", "trainer.max_steps=200", "trainer.log_every=20"], 0.03),
    # GPT-2 124M's shape, its first steps (a small batch: the CPU computes the reference)
    "gpt2_124m": (["+experiment=gpt2_124m", "data.tokenizer=byte", "trainer.batch_size=2", "trainer.grad_accum=1",
                   "trainer.max_steps=4", "trainer.log_every=1"], 0.02),
}


@pytest.mark.parametrize("run", AGREE)
def test_losses_agree_with_the_cpus_within_bf16_tolerance(tmp_path, run):
    """bf16 activations and the chip's kernels (splash, the blockwise cross-entropy) against the
    CPU's float32 path, on the same batches: each logged window's mean loss within the run's
    tolerance (bf16 keeps 8 bits of mantissa: 0.4% a rounding)."""
    overrides, tolerance = AGREE[run]
    common = ["-m", "theseus.run", *overrides, "trainer.eval_every=0", "logger.mode=disabled"]
    on_chip(*common, "hydra.run.dir=chip", cwd=tmp_path)
    cpu = run_python(*common, "hydra.run.dir=cpu", cwd=tmp_path, timeout=1800)
    assert cpu.returncode == 0, cpu.stderr[-3000:]
    for chip, host in zip(windows(tmp_path / "chip"), windows(tmp_path / "cpu"), strict=True):
        assert chip["loss"] == pytest.approx(host["loss"], rel=tolerance), (chip["step"], chip["loss"], host["loss"])


def test_every_task_samples_evaluates_and_exports(tmp_path):
    run = ["-m", "theseus.run", "logger.mode=disabled", "trainer.eval_every=0"]
    on_chip(*run, "+experiment=sft_tiny", "trainer.max_steps=20", "hydra.run.dir=sft", cwd=tmp_path)
    reply = on_chip("-m", "theseus.sample", "sft", "--chat", "What does os.getcwd do?", "--max-new-tokens", "16",
                    cwd=tmp_path)
    assert reply.stdout.strip()
    on_chip("-m", "theseus.sample", "sft", "--prompt", "def ", "--max-new-tokens", "8", cwd=tmp_path)
    on_chip("-m", "theseus.evaluate", "sft", cwd=tmp_path)
    on_chip("-m", "theseus.export", "sft", "sft-hf", cwd=tmp_path)
    assert (tmp_path / "sft-hf" / "model.safetensors").is_file()
    on_chip(*run, "+experiment=sft_tiny", "trainer.init_from=sft-hf", "architecture.lora.rank=4", "trainer.max_steps=10",
            "hydra.run.dir=lora", cwd=tmp_path)
    on_chip("-m", "theseus.export", "lora", "lora-adapter", "--adapter", cwd=tmp_path)
    assert (tmp_path / "lora-adapter" / "adapter_model.safetensors").is_file()
    on_chip(*run, "+experiment=dpo_tiny", "trainer.init_from=sft", "trainer.max_steps=10", "hydra.run.dir=dpo",
            cwd=tmp_path)
    reverse = [{"prompt": [{"role": "user", "content": f"reverse {w}"}], "answer": w[::-1]}
               for w in ("abcd", "bcde", "cdef", "defg", "efgh", "fghi", "ghij", "hijk")] * 4
    (tmp_path / "reverse_prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in reverse))
    (tmp_path / "rewards.py").write_text((ROOT / "tests" / "accelerator" / "rewards.py").read_text())
    on_chip(*run, "+experiment=grpo_tiny", "trainer.init_from=sft", "trainer.max_steps=4", "hydra.run.dir=grpo",
            cwd=tmp_path)
    assert len(windows(tmp_path / "dpo")) == 1 and len(windows(tmp_path / "grpo")) == 1
