"""A tiny Hydra app for the sweep tests: theseus's Hydra settings (its SweepSummary callback, its
log filters) and sweep files (``+sweep=NAME``) around a fake training run.

The task writes metrics.jsonl as a run would; its final val_loss, the returned objective, is
smallest at optimizer.lr=3e-3; ``+trainer.seed=S`` adds seed noise, NOISE[S]. optimizer.lr >= 0.1
diverges: it raises before evaluating.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from theseus.config import registry
from theseus.config.compose import conf_dir

registry.store()
ConfigStore.instance().store(name="app", node={
    "optimizer": {"lr": 1e-3},
    "trainer": {"batch_size": 4, "max_steps": 20},
    "architecture": {"seq_len": 16},
    "hydra": OmegaConf.load(conf_dir() / "config.yaml").hydra,  # theseus's: its summary callback, its log filters
})


NOISE = (0.0, 0.03, -0.01, 0.02)


def val_loss(lr: float, seed: int = 0) -> float:
    return 2.0 + (math.log10(lr) - math.log10(3e-3)) ** 2 + NOISE[seed]


@hydra.main(version_base=None, config_name="app")
def main(cfg: DictConfig) -> float:
    lr, steps, seed = cfg.optimizer.lr, cfg.trainer.max_steps, cfg.trainer.get("seed", 0)
    metrics = Path(HydraConfig.get().runtime.output_dir) / "metrics.jsonl"
    with metrics.open("w") as out:
        for step in range(0, steps + 1, 10):
            line = {"step": step, "loss": 4.0 - step / steps, "lr": lr, "tokens_per_s": 1000.0 + step, "mfu": 0.01}
            out.write(json.dumps(line) + "\n")
        if lr >= 0.1:
            raise FloatingPointError(f"loss is nan at step {steps}\n(lr={lr})")
        out.write(json.dumps({"step": steps, "val_loss": val_loss(lr, seed)}) + "\n")
    return val_loss(lr, seed)


if __name__ == "__main__":
    main()
