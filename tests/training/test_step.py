"""The train step's refusal of non-finite updates, on a toy regression model."""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from theseus.config import field
from theseus.model.module import Module
from theseus.tasks.task import LossTask
from theseus.training.state import init_state
from theseus.training.step import train_step


class Linear(Module):
    """``tokens: int[batch, seq] -> [batch, seq, 2]``: a weight per position's value, for tests."""

    width: int = field("architecture/width", default=2)

    def setup(self):
        self.w = self.param("w", jax.nn.initializers.ones, (self.width,))

    def __call__(self, tokens, deterministic=True):
        return tokens[..., None].astype(jnp.float32) * self.w


def loss_fn(logits, targets):
    """Mean squared error, NaN when any target is negative (a planted bad batch)."""
    bad = jnp.any(targets < 0)
    return jnp.where(bad, jnp.nan, jnp.mean((logits - targets[..., None]) ** 2))


@dataclasses.dataclass(frozen=True)
class NextValue(LossTask):
    """Predict each position's next value (``loss_fn``) from ``batch[:, :-1]``."""

    def loss(self, model, params, batch, rng):
        return loss_fn(model.apply({"params": params}, batch[:, :-1], deterministic=rng is None), batch[:, 1:])


@pytest.mark.parametrize("skip", [False, True])
def test_nonfinite_updates_are_refused(skip):
    model, tx = Linear(), optax.sgd(0.01)
    state = nn.unbox(init_state(model, tx, seq_len=3, seed=0))
    step = jax.jit(functools.partial(train_step, model=model, task=NextValue(), tx=tx, schedule=lambda s: 0.01,
                                     skip_nonfinite=skip))
    good = (jnp.arange(8, dtype=jnp.int32).reshape(1, 2, 4) % 3) + 1
    bad = good.at[0, 0, -1].set(-1)
    key = jax.random.key(0)
    after_good, _ = step(state, good, key)
    assert not np.allclose(after_good.params["w"], state.params["w"])
    after_bad, metrics = step(after_good, bad, key)
    np.testing.assert_array_equal(after_bad.params["w"], after_good.params["w"])  # refused
    assert int(after_bad.first_nonfinite) == 2 and int(metrics["nonfinite_skipped"]) == 1
    after_next, _ = step(after_bad, good, key)
    moved = not np.allclose(after_next.params["w"], after_bad.params["w"])
    assert moved == skip  # skipping goes on; stopping keeps the last good state
    assert int(after_next.step) == 3 and int(after_next.first_nonfinite) == 2


def loads(routing: dict, n_experts: int) -> jax.Array:
    """A layer's sown ``moe/load_e{i}`` as one vector ``[expert]``."""
    return jnp.stack([routing[f"moe/load_e{i}"] for i in range(n_experts)])


def moe_steps(rate: float, steps: int) -> tuple[list[float], list[dict], dict]:
    """``steps`` AdamW steps of a 2-layer MoEGPT (4 experts, top-1) whose router is scaled up to
    route unevenly, on one fixed batch: each step's mean over layers of the largest expert's
    load, the biases before each step, and the first step's per-layer loads."""
    from theseus.config import configuration, configure
    from theseus.model.models.moe_gpt import MoEGPT
    from theseus.model.module import AUXILIARY
    from theseus.tasks.lm import LanguageModeling

    arch = {"n_layers": 2, "d_model": 32, "n_heads": 4, "seq_len": 16, "vocab_size": 64,
            "moe": {"n_experts": 4, "top_k": 1, "capacity_factor": None, "bias_update_rate": rate}}
    with configuration({"architecture": arch}):
        model = configure(MoEGPT)
    tx = optax.adamw(1e-4, weight_decay=0.1)  # slow: the router learns little in the steps
    state = nn.unbox(init_state(model, tx, seq_len=16, seed=0))
    state = state.replace(params=jax.tree_util.tree_map_with_path(
        lambda path, p: p * 30 if path[-1].key == "router" else p, state.params))
    tokens = jax.random.randint(jax.random.key(1), (1, 8, 17), 0, 64)
    step = jax.jit(functools.partial(train_step, model=model, task=LanguageModeling(), tx=tx, schedule=lambda s: 1e-4))
    _, sown = model.apply({"params": state.params}, tokens[0, :, :-1], mutable=[AUXILIARY])
    first = {name: loads(layer["mlp"]["routing"][0], 4) for name, layer in sown[AUXILIARY].items()}
    largest, biases = [], []
    for _ in range(steps):
        biases.append({name: state.params[name]["mlp"].get("b_route") for name in first})
        state, metrics = step(state, tokens, jax.random.key(0))
        largest.append(max(float(metrics[f"moe/load_e{i}"]) for i in range(4)))
    return largest, biases, first


@pytest.mark.slow
def test_bias_balanced_routing_moves_each_bias_by_the_rate_against_its_load():
    """DeepSeek-V3's update outside the gradient: after one step each layer's bias is
    ``-rate x sign(load - 1/4)`` of the first step's loads (AdamW, weight decay on, leaves it
    to that), and over steps the largest expert's load falls, where without the bias it stays."""
    rate = 0.05
    largest, biases, first = moe_steps(rate, 12)
    for name, load in first.items():
        np.testing.assert_array_equal(np.asarray(biases[0][name]), 0.0)
        np.testing.assert_allclose(np.asarray(biases[1][name]), -rate * np.sign(np.asarray(load) - 0.25), rtol=1e-6)
    unbalanced, no_bias, _ = moe_steps(0.0, 12)
    assert all(b is None for step in no_bias for b in step.values())  # rate 0: no parameter
    assert largest[0] == pytest.approx(unbalanced[0]) and largest[0] > 0.3  # balanced: 0.25
    assert max(largest[-4:]) < 0.27 < min(unbalanced[-4:]), (largest, unbalanced)


def test_routing_biases_in_a_model_declaring_no_rate_are_refused():
    """A user's GPT with MoE feed-forwards (``Block.mlp_cls``) and a bias rate set: the MoE
    layers hold biases, the model no rate for the step; refused in one line, not trained as
    weights by the optimizer."""
    from theseus.config import ConfigError, configuration, configure
    from theseus.model.layers import Block
    from theseus.model.models.gpt import GPT
    from theseus.model.moe import MoE

    class MoEFFBlock(Block):
        mlp_cls = MoE

    class MyGPT(GPT):
        block_cls = MoEFFBlock

    arch = {"n_layers": 1, "d_model": 32, "n_heads": 4, "seq_len": 16, "vocab_size": 64,
            "moe": {"n_experts": 4, "bias_update_rate": 0.01}}
    with configuration({"architecture": arch}):
        model = configure(MyGPT)
    with pytest.raises(ConfigError, match=r"^architecture.moe.bias_update_rate is set, but MyGPT declares no "
                                          r"bias_update_rate for the train step to apply: subclass MoEGPT"):
        jax.eval_shape(lambda: init_state(model, optax.adamw(1e-3), seq_len=16, seed=0))
