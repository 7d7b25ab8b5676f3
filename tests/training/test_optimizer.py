"""Schedules, the weight-decay mask by parameter role, and the optimizer group's options."""

from __future__ import annotations

import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from theseus.config import ConfigError, configuration, configure
from theseus.config.compose import compose
from theseus.config.registry import chosen
from theseus.model.models.gpt import GPT
from theseus.training.optimizer import (
    SGD,
    Adafactor,
    AdamW,
    Lion,
    Muon,
    OptimizerConfig,
    clip_by_global_norm,
    decay_mask,
    make_optimizer,
    make_schedule,
    optimizer_class,
)
from theseus.recipe import assemble, resolve
from theseus.training.trainer import Trainer


def schedule(**values):
    with configuration({f"optimizer.{k}": v for k, v in values.items()}):
        return make_schedule(configure(OptimizerConfig), 100)


def test_constant_with_warmup():
    lr = schedule(schedule="constant", lr=1.0, warmup_steps=10)
    assert [float(lr(s)) for s in (0, 5, 10, 99)] == pytest.approx([0.0, 0.5, 1.0, 1.0])


def test_cosine_reaches_min_ratio():
    lr = schedule(schedule="cosine", lr=2.0, warmup_steps=10, min_lr_ratio=0.1)
    assert float(lr(10)) == pytest.approx(2.0)
    halfway = 0.2 + (2.0 - 0.2) * 0.5 * (1 + math.cos(math.pi * 45 / 90))
    assert float(lr(55)) == pytest.approx(halfway, rel=1e-5)
    assert float(lr(100)) == pytest.approx(0.2, rel=1e-5)


def test_wsd_warmup_stable_decay():
    lr = schedule(schedule="wsd", lr=1.0, warmup_steps=10, min_lr_ratio=0.0, decay_fraction=0.2)
    assert [float(lr(s)) for s in (5, 10, 50, 80, 90, 100)] == pytest.approx([0.5, 1.0, 1.0, 1.0, 0.5, 0.0], abs=1e-6)


def test_warmup_longer_than_run_is_clamped():
    lr = schedule(schedule="cosine", lr=1.0, warmup_steps=1000)
    assert np.isfinite(float(lr(50))) and float(lr(100)) == pytest.approx(1.0)


# -- weight decay by role -------------------------------------------------------------------

TINY = {"architecture.vocab_size": 64, "architecture.seq_len": 16, "architecture.n_layers": 2,
        "architecture.d_model": 32, "architecture.n_heads": 4}
LLAMA = {**TINY, "architecture.norm": "rmsnorm", "architecture.activation": "swiglu", "architecture.positions": "rope",
         "architecture.bias": False, "architecture.tie_embeddings": False, "architecture.n_kv_heads": 2}
# The weight matrices of each tree, written out by hand: the reference the mask must equal.
BLOCK_WEIGHTS = {"attn/wq", "attn/wk", "attn/wv", "attn/wo", "mlp/w_up", "mlp/w_out"}
WEIGHTS = {
    "gpt2": {f"h_{i}/{w}" for i in range(2) for w in BLOCK_WEIGHTS},
    "llama": {f"h_{i}/{w}" for i in range(2) for w in (*BLOCK_WEIGHTS, "mlp/w_gate")} | {"lm_head"},
}


def abstract_params(arch: dict):
    with configuration(arch):
        model = configure(GPT)
    return jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 16), jnp.int32))["params"]


def paths(tree) -> dict[str, bool]:
    return {"/".join(str(k.key) for k in path if hasattr(k, "key")): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("name, arch", [("gpt2", TINY), ("llama", LLAMA)])
def test_exactly_the_weight_matrices_decay(name, arch):
    for params in (abstract_params(arch), nn.unbox(abstract_params(arch))):  # tx.init sees boxes, update plain
        mask = paths(decay_mask(params))
        assert {path for path, decays in mask.items() if decays} == WEIGHTS[name]
    plain = paths(nn.unbox(abstract_params(arch)))
    if name == "gpt2":  # biases of two dimensions are biases still
        assert plain["h_0/attn/bq"].shape == (4, 8) and plain["h_0/mlp/b_up"].shape == (128,)
        assert not mask["h_0/attn/bq"] and not mask["h_0/mlp/b_up"] and not mask["wte/embedding"]


# -- the options -----------------------------------------------------------------------------

def updates(tx: optax.GradientTransformation, steps: int = 3):
    """The updates ``tx`` makes over a few fixed gradients of a small tree with every role."""
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(8, 4)), jnp.float32), "bq": jnp.ones((2, 3)),
              "embedding": jnp.ones((5, 4)), "scale": jnp.ones(4)}
    state, out = tx.init(params), []
    for _ in range(steps):
        grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
        update, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, update)
        out.append(update)
    return out


@pytest.mark.parametrize("cls, reference", [
    (AdamW, lambda c, lr: optax.adamw(lr, b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay, mask=decay_mask)),
    (Lion, lambda c, lr: optax.lion(lr, b1=c.b1, b2=c.b2, weight_decay=c.weight_decay, mask=decay_mask)),
    (SGD, lambda c, lr: optax.sgd(lr, momentum=c.momentum, nesterov=True)),  # decay 0: optax.sgd has none
], ids=["adamw", "lion", "sgd_nesterov"])
def test_options_equal_the_optax_aliases(cls, reference):
    config = configure(cls, clip_norm=None, **({"nesterov": True, "weight_decay": 0.0} if cls is SGD else {}))
    tx, lr = make_optimizer(config, 10)
    for ours, theirs in zip(updates(tx), updates(reference(config, lr)), strict=True):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), ours, theirs)


@pytest.mark.parametrize("scale", [0.05, 1.0, 40.0])  # under the limit (untouched) and over it (scaled down)
def test_clipping_scales_the_gradients_as_torch_and_optax_do(scale):
    import torch

    rng = np.random.default_rng(0)
    grads = {"w": rng.normal(size=(6, 5)).astype(np.float32) * scale,
             "b": rng.normal(size=7).astype(np.float32) * scale}
    ours, _ = clip_by_global_norm(1.0).update(jax.tree.map(jnp.asarray, grads), optax.EmptyState())
    theirs, _ = optax.clip_by_global_norm(1.0).update(jax.tree.map(jnp.asarray, grads), optax.EmptyState())
    tensors = {name: torch.zeros(g.shape, requires_grad=True) for name, g in grads.items()}
    for name, t in tensors.items():
        t.grad = torch.tensor(grads[name])
    torch.nn.utils.clip_grad_norm_(list(tensors.values()), 1.0)  # its norm has 1e-6 added
    for name in grads:
        np.testing.assert_allclose(ours[name], tensors[name].grad.numpy(), rtol=2e-6)
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-6)
    assert float(optax.global_norm(ours)) == pytest.approx(min(1.0, float(optax.global_norm(grads))), rel=1e-6)


def test_adafactor_equals_optax_without_decay():
    config = configure(Adafactor, clip_norm=None, weight_decay=0.0, min_dim_size_to_factor=4)
    tx, lr = make_optimizer(config, 10)
    theirs = optax.adafactor(lr, min_dim_size_to_factor=4)
    for a, b in zip(updates(tx), updates(theirs), strict=True):
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7), a, b)


def test_muon_orthogonalises_weights_and_adams_the_rest():
    config = configure(Muon, clip_norm=None, weight_decay=0.0, schedule="constant", warmup_steps=0, lr=1.0)
    tx, _ = make_optimizer(config, 10)
    first = updates(tx, steps=1)[0]
    singular = np.linalg.svd(np.asarray(first["w"]), compute_uv=False)  # Newton-Schulz: all near 1 x shape scale
    assert singular.max() / singular.min() < 1.6
    adam = updates(optax.adam(1.0, b1=config.adam_b1, b2=config.adam_b2, nesterov=True), steps=1)[0]
    np.testing.assert_allclose(first["scale"], adam["scale"], rtol=1e-5)


@pytest.mark.parametrize("name", ["adamw", "lion", "adafactor", "sgd", "muon"])
def test_the_composed_choice_builds_its_option(name):
    cfg = compose(["+experiment=gpt_tiny", f"optimizer={name}"])
    assert chosen(cfg, "optimizer") == name
    with configuration(cfg):
        assert configure(optimizer_class(cfg)).name == name


def test_a_key_of_another_optimizer_is_one_line():
    applies = r"optimizer.b2 does not apply to the optimizer chosen.*optimizer=adamw, optimizer=lion"
    with pytest.raises(ConfigError, match=applies):
        compose(["+experiment=gpt_tiny", "optimizer=sgd", "optimizer.b2=0.9"])
    with pytest.raises(ConfigError, match="did you mean optimizer.momentum"):
        compose(["+experiment=gpt_tiny", "optimizer=sgd", "optimizer.momentun=0.5"])
    with pytest.raises(ConfigError, match="unknown config key 'optimizer.name'"):  # the group chooses: optimizer=lion
        compose(["+experiment=gpt_tiny", "optimizer.name=lion"])


@pytest.mark.parametrize("values, message", [
    ({"lr": -1.0}, "optimizer.lr must be positive"),
    ({"b2": 1.0}, r"optimizer.b2 must be in \[0, 1\)"),
], ids=["lr", "b2"])
def test_out_of_range_is_refused(values, message):
    with configuration({f"optimizer.{k}": v for k, v in values.items()}), pytest.raises(ConfigError, match=message):
        configure(AdamW)


# One learning rate per optimizer that trains gpt_tiny in 15 steps (Lion's sign updates want
# a smaller one than Adam; SGD and Adafactor's relative steps a larger one).
LR = {"adamw": 3e-3, "lion": 1e-3, "adafactor": 3e-2, "sgd": 0.3, "muon": 2e-2}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("".join(open(m.__file__, encoding="utf-8").read() for m in (json, optax, np, jax)))
    return path, path.parent / "cache"  # tokenized once for every optimizer


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LR))
def test_each_optimizer_trains_gpt_tiny(name, corpus, tmp_path):
    text, cache = corpus
    cfg = compose(["+experiment=gpt_tiny", f"optimizer={name}", f"optimizer.lr={LR[name]}", "optimizer.warmup_steps=2",
                   "data.source=text", f"data.path={text}", f"data.cache_dir={cache}", "trainer.max_steps=15",
                   "trainer.batch_size=8", "trainer.log_every=1", "trainer.eval_every=0",
                   "trainer.eval_batches=1", "logger.mode=disabled"])
    Trainer(assemble(resolve(cfg, tmp_path / "run"))).run(tmp_path / "run")
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [line["loss"] for line in lines if "loss" in line]
    assert len(losses) == 15 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < losses[0] - 0.5, losses
