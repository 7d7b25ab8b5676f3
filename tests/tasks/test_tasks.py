"""Tasks: the lm task's loss against numpy, a user's own task trained by the trainer, and the
choice of task in the composed config."""

from __future__ import annotations

import dataclasses
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import ConfigError, register
from theseus.config.compose import compose
from theseus.config.registry import chosen
from theseus.tasks import JobTask, LanguageModeling, task_class
from theseus.tasks.lm import cross_entropy
from theseus.recipe import assemble, resolve
from theseus.training.trainer import Trainer


@register("task", "doubled_lm")
@dataclasses.dataclass(frozen=True)
class DoubledLM(LanguageModeling):
    """A user's task: twice the next-token loss (so its first logged loss is exactly 2x lm's)."""

    def loss(self, model, params, batch, rng):
        return 2 * super().loss(model, params, batch, rng)


TINY = ["+experiment=gpt_tiny", "trainer.max_steps=3", "trainer.log_every=1", "trainer.eval_every=0",
        "trainer.eval_batches=1", "trainer.checkpoint_every=0", "logger.mode=disabled"]


def train(tmp_path, name: str, *overrides: str) -> list[dict]:
    run_dir = tmp_path / name
    cfg = compose([*TINY, f"data.cache_dir={tmp_path / 'cache'}", *overrides])
    Trainer(assemble(resolve(cfg, run_dir))).run(run_dir)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_users_task_is_what_the_trainer_optimises(tmp_path):
    lm = train(tmp_path, "lm")
    doubled = train(tmp_path, "doubled", "task=doubled_lm")
    first_lm, first_doubled = (next(r["loss"] for r in rows if "loss" in r) for rows in (lm, doubled))
    assert math.isclose(first_doubled, 2 * first_lm, rel_tol=1e-5)  # same init, the task's loss
    val_lm, val_doubled = (next(r["val_loss"] for r in rows if "val_loss" in r) for rows in (lm, doubled))
    assert math.isclose(val_doubled, 2 * val_lm, rel_tol=1e-2)  # evaluation is the task's too


def test_the_composed_config_names_its_task():
    assert chosen(compose([]), "task") == "lm" and task_class(compose([])) is LanguageModeling
    assert chosen(compose(["+experiment=pmm_regression"]), "task") == "regression"
    assert issubclass(task_class(compose(["+experiment=pmm_regression"])), JobTask)


def test_a_key_of_another_task_names_the_task_it_applies_to(tmp_path, monkeypatch):
    """On the command line, from an experiment file, with the options imported or not (before:
    ``unknown config key 'dpo'``)."""
    with pytest.raises(ConfigError) as err:
        compose(["+experiment=gpt_tiny", "task=sft", "dpo.loss_type=ipo"])
    assert str(err.value) == "dpo.loss_type applies to task=dpo only (task=sft here): drop it or set task=dpo"
    with pytest.raises(ConfigError, match=r"^grpo.beta applies to task=grpo only \(task=dpo here\): drop it or "
                                          r"set task=grpo$"):
        compose(["+experiment=dpo_tiny", "grpo.beta=0.1"])  # dpo_tiny chooses task=dpo
    monkeypatch.chdir(tmp_path)
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "mine.yaml").write_text("# @package _global_\ndpo:\n  beta: 0.5\n")
    with pytest.raises(ConfigError) as err:
        compose(["+experiment=mine"])
    assert str(err.value) == (f"in {tmp_path}/experiments/mine.yaml: dpo.* applies to task=dpo only (task=lm here): "
                              f"drop it or set task=dpo")
    assert compose(["+experiment=mine", "task=dpo"]).dpo.beta == 0.5


def test_the_trainer_refuses_a_task_that_runs_itself():
    with pytest.raises(ConfigError, match="task=regression runs its job itself"):
        assemble(resolve(compose(["+experiment=pmm_regression"])), steps=None)


def test_cross_entropy_ignores_minus_one_targets_like_numpy():
    logits = jnp.asarray(3 * np.random.default_rng(0).standard_normal((2, 5, 7)), jnp.float32)
    targets = jnp.array([[1, 6, -1, 0, 2], [-1, -1, 3, 4, 5]])
    lg = np.asarray(logits, np.float64)
    log_probs = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    picked = [-log_probs[b, s, t] for b in range(2) for s in range(5) if (t := int(targets[b, s])) != -1]
    loss = cross_entropy(logits, targets)
    assert loss.dtype == jnp.float32 and math.isclose(float(loss), float(np.mean(picked)), rel_tol=1e-6)
    low = cross_entropy(logits.astype(jnp.bfloat16), targets)
    assert low.dtype == jnp.float32 and math.isclose(float(low), float(np.mean(picked)), rel_tol=2e-2)
    assert float(cross_entropy(logits, jnp.full((2, 5), -1))) == 0.0
