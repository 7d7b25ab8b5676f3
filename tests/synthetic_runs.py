"""Synthetic run directories as training jobs leave them (config, overrides, metrics, result),
for the report and runs-as-data tests: cheap, and with known numbers."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from omegaconf import OmegaConf

from theseus.training.run_files import RESULT


def final_val_loss(lr: float, seed: int) -> float:
    """The last val_loss of a finished synthetic run: least at lr=3e-3, seeds add noise."""
    return 2.0 + abs(math.log10(lr / 3e-3)) + 0.02 * ((seed * 7919) % 5 - 2)


def write_run(path: Path, lr: float = 1e-3, seed: int = 0, steps: int = 200, upto: int | None = None,
              status: str | None = "ok", name: str | None = None, error: str = "",
              composed: tuple[list[str], dict] | None = None) -> Path:
    """A run of ``steps`` steps, logged every 10 (val_loss every 50 and at the end) up to ``upto``
    (default: all of them); ``status`` (ok, failed, None: no result.json) its recorded end;
    ``composed``: the overrides and config it records instead (a real command's)."""
    (path / ".hydra").mkdir(parents=True, exist_ok=True)
    config = {"optimizer": {"lr": lr}, "trainer": {"batch_size": 16, "max_steps": steps, "seed": seed},
              "architecture": {"seq_len": 64}, "logger": {"name": name}}
    overrides = ["+experiment=gpt_tiny", f"optimizer.lr={lr}", f"trainer.seed={seed}"]
    overrides, config = composed or (overrides, config)
    OmegaConf.save(config, path / ".hydra" / "config.yaml")
    OmegaConf.save(overrides, path / ".hydra" / "overrides.yaml")
    final = final_val_loss(lr, seed)
    lines = []
    for step in range(10, (upto or steps) + 1, 10):
        loss = final - 0.1 + 3 * math.exp(-step / 40) * (1 - step / steps)
        lines.append({"step": step, "loss": loss, "lr": lr, "grad_norm": 1.0 + 1 / step, "step_time": 0.5,
                      "tokens_per_s": 2048.0, "mfu": 0.1})
        if step % 50 == 0 or step == steps:
            lines.append({"step": step, "val_loss": final if step == steps else loss + 0.1})
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if status is not None:
        (path / RESULT).write_text(json.dumps({"status": status, "error": error}))
    return path


def append_steps(path: Path, start: int, stop: int) -> None:
    """Log steps ``start..stop`` (every 10) to a run in progress."""
    with (path / "metrics.jsonl").open("a") as f:
        for step in range(start, stop + 1, 10):
            f.write(json.dumps({"step": step, "loss": 2.5, "lr": 1e-3, "step_time": 0.5, "tokens_per_s": 2048.0}) + "\n")


def age(path: Path, seconds: float) -> None:
    """Make a run's metrics look ``seconds`` old (a run that stopped logging)."""
    stamp = os.path.getmtime(path / "metrics.jsonl") - seconds
    os.utime(path / "metrics.jsonl", (stamp, stamp))


LRS = (1e-3, 3e-3, 1e-2)
SEEDS = (0, 1)


def write_sweep(path: Path, running: bool = True) -> Path:
    """A sweep of 3 learning rates x 2 seeds, job i = (LRS[i // 2], SEEDS[i % 2]); with
    ``running``, the last job is still at step 120 of 200 (no result yet)."""
    for i, (lr, seed) in enumerate((lr, seed) for lr in LRS for seed in SEEDS):
        last = running and i == len(LRS) * len(SEEDS) - 1
        write_run(path / str(i), lr, seed, upto=120 if last else None, status=None if last else "ok")
    return path
