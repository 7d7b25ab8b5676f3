"""The derived schema composed through Hydra, with command-line-style overrides."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from theseus.config import ConfigError, field, register
from theseus.config.compose import compose
from theseus.config.errors import suggest
from theseus.model.module import Module


@register("model", "toy")
class Toy(Module):
    scale: float = field("architecture/scale", default=1.0, help="multiplier applied to x")
    n_layers: int = field("architecture/n_layers", default=12, help="number of blocks")

    def __call__(self, x):
        return x * self.scale


def test_defaults_and_overrides():
    cfg = compose(["model=toy"])
    assert cfg.architecture.scale == 1.0 and cfg.optimizer.lr == 3e-4 and cfg.mesh.data == -1
    cfg = compose(["model=toy", "architecture.scale=2", "optimizer.lr=1e-3", "trainer.max_steps=5"])
    assert (cfg.architecture.scale, cfg.optimizer.lr, cfg.trainer.max_steps) == (2.0, 1e-3, 5)


def test_misspelt_key_suggests_the_intended_one():
    with pytest.raises(ConfigError) as err:
        compose(["model=toy", "architecture.scael=2"])
    message = str(err.value)
    assert "\n" not in message
    assert "did you mean architecture.scale (float, default 1.0: multiplier applied to x)?" in message


def test_the_suggestion_gives_the_value_the_chosen_experiment_sets():
    """Under gpt_small the default (3e-4) is not what runs: the experiment's 1e-3 is named beside it."""
    with pytest.raises(ConfigError) as err:
        compose(["+experiment=gpt_small", "optimizer.learning_rate=2e-3"])
    assert "did you mean optimizer.lr (float, default 0.0003, +experiment=gpt_small sets 0.001: " in str(err.value)
    with pytest.raises(ConfigError) as err:  # set on the command line too: that value, not the file's, runs
        compose(["+experiment=gpt_small", "optimizer.lr=2e-3", "optimizer.learning_rate=2e-3"])
    assert "did you mean optimizer.lr (float, default 0.0003: " in str(err.value)


def test_wrong_type_names_key_and_type():
    with pytest.raises(ConfigError, match=r"architecture.n_layers: Value 'abc' .* Integer \(int, default 12: "):
        compose(["model=toy", "architecture.n_layers=abc"])


def test_value_outside_choices():
    with pytest.raises(ConfigError, match="logger.mode must be one of offline, online, disabled"):
        compose(["model=toy", "logger.mode=loud"])


def test_unknown_experiment_lists_available():
    with pytest.raises(ConfigError, match="unknown experiment 'nope'; available:"):
        compose(["model=toy", "+experiment=nope"])


def test_suggest_prefers_siblings():
    known = ["architecture.n_layers", "architecture.n_heads", "optimizer.lr"]
    assert suggest("architecture.n_layer", known)[0] == "architecture.n_layers"
    assert suggest("optimizer.lrr", known) == ["optimizer.lr"]


@pytest.mark.slow
def test_a_composed_config_is_checked_once_and_configure_takes_its_values(monkeypatch):
    """compose() checks each value (OmegaConf's typed nodes, then validate) and marks the config;
    building a model from it, children included, converts nothing again. A plain dict is
    checked where configure() reads it."""
    from theseus.config import configuration, configure, context
    from theseus.model.models.gpt import GPT

    calls = []
    converted = context._converted
    monkeypatch.setattr(context, "_converted", lambda spec, value: calls.append(spec.key) or converted(spec, value))
    cfg = compose(["+experiment=gpt_tiny", "optimizer.lr=1"])
    assert cfg.optimizer.lr == 1.0 and isinstance(cfg.optimizer.lr, float)  # typed by the schema node
    composing = len(calls)  # the types OmegaConf cannot express, checked by validate
    with configuration(cfg):
        model = configure(GPT, vocab_size=64)
    model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))  # setup() of every child runs
    assert len(calls) == composing
    with configuration({"architecture.n_layers": 2, "architecture.dropout": 0}):
        model = configure(GPT, vocab_size=64)
    assert model.dropout == 0.0 and isinstance(model.dropout, float) and len(calls) > composing
    with configuration({"architecture.n_layers": "two"}):
        with pytest.raises(ConfigError, match="architecture.n_layers must be int"):
            configure(GPT, vocab_size=64)
