"""The mixture-of-experts layer against a per-token NumPy reference, its capacity rule, FLOPs,
auxiliary losses and checks; MoEGPT's every-N-th layer and scanned layers."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import ConfigError, configuration, configure
from theseus.model.generate import generate
from theseus.model.layers import MLP, Block
from theseus.model.models.gpt import GPT, stack_layers
from theseus.model.models.moe_gpt import MoEGPT
from theseus.model.module import AUXILIARY, auxiliary
from theseus.model.moe import MoE, MoEBlock
from theseus.tasks.lm import LanguageModeling, cross_entropy

D, E = 16, 4


def build(**moe) -> tuple[MoE, dict, jax.Array]:
    """An MoE of width D over E experts, its params and an input ``[3, 10, D]``."""
    with configuration({"architecture": {"d_model": D, "d_ff": 24, "moe": {"n_experts": E, **moe}}}):
        layer = configure(MoE)
    x = jax.random.normal(jax.random.key(1), (3, 10, D))
    return layer, init(layer, x), x


def init(layer: MoE, x: jax.Array) -> dict:
    """Its parameters, scaled up for sharper routing than the init's (so that choices differ)."""
    return jax.tree.map(lambda p: p * 20, nn.unbox(layer.init(jax.random.key(0), x)["params"]))


def expert_mlp(x: np.ndarray, p: dict, swiglu: bool, e: int | None = None) -> np.ndarray:
    """Expert ``e``'s MLP of the layer's params ``p`` (None: ``p`` is one MLP's, the shared expert's)."""
    weight = (lambda name: p[name]) if e is None else (lambda name: p[name][e])  # noqa: E731
    h = [x @ weight(f"w_{name}") for name in (("gate", "up") if swiglu else ("up",))]
    h = h[0] / (1 + np.exp(-h[0])) * h[1] if swiglu else np.asarray(jax.nn.gelu(h[0], approximate=True))
    return h @ weight("w_out")


def reference(params: dict, x: np.ndarray, top_k: int, capacity: int | None, swiglu: bool, norm: bool = True,
              shared: bool = False) -> tuple[np.ndarray, float]:
    """Token by token: softmax routing, top-k, an expert accepts a sequence's choices first
    choices first, then by position, until it holds ``capacity``. Returns (y, dropped)."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    x = np.asarray(x, np.float64)
    y, dropped = np.zeros_like(x), 0
    for b in range(x.shape[0]):
        logits = x[b] @ p["router"]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        order = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
        weights = np.take_along_axis(probs, order, -1)
        if norm:
            weights /= weights.sum(-1, keepdims=True)
        held = np.zeros(E, int)
        for j in range(top_k):
            for s in range(x.shape[1]):
                e = order[s, j]
                if capacity is not None and held[e] >= capacity:
                    dropped += 1
                    continue
                held[e] += 1
                y[b, s] += weights[s, j] * expert_mlp(x[b, s], p, swiglu, e)
        if shared:
            mlp = p["shared"]
            gate = 1 / (1 + np.exp(-(x[b] @ p["shared_gate"])))
            y[b] += gate * expert_mlp(x[b], mlp, swiglu)
    return y, dropped / (x.shape[0] * x.shape[1] * top_k)


@pytest.mark.slow
@pytest.mark.parametrize("activation, top_k, norm", [("swiglu", 2, True), ("gelu", 1, True), ("swiglu", 3, False)])
def test_dropless_layer_equals_the_per_token_reference(activation, top_k, norm):
    layer, params, x = build(top_k=top_k, capacity_factor=None, norm_topk_prob=norm)
    layer = layer.clone(activation=activation)
    params = init(layer, x)
    y, sown = jax.jit(lambda p, x: layer.apply({"params": p}, x, mutable=[AUXILIARY]))(params, x)
    expected, dropped = reference(params, x, top_k, None, activation == "swiglu", norm)
    np.testing.assert_allclose(y, expected, atol=1e-4, rtol=1e-4)
    assert dropped == 0 and auxiliary(sown)[1]["moe/dropped"] == 0


def test_capacity_drops_later_choices_and_counts_them():
    layer, params, x = build(top_k=2, capacity_factor=0.6)  # 3 slots per expert for 20 choices of a sequence
    assert layer.capacity(10) == 3
    y, sown = layer.apply({"params": params}, x, mutable=[AUXILIARY])
    expected, dropped = reference(params, x, 2, 3, swiglu=False)
    np.testing.assert_allclose(y, expected, atol=1e-4, rtol=1e-4)
    assert dropped > 0.3
    assert float(auxiliary(sown)[1]["moe/dropped"]) == pytest.approx(dropped)


def test_shared_expert_with_its_gate():
    x = jax.random.normal(jax.random.key(1), (3, 10, D))
    with configuration({"architecture": {"d_model": D, "d_ff": 24, "bias": False, "activation": "swiglu",
                                         "moe": {"n_experts": E, "capacity_factor": None, "shared_d_ff": 8,
                                                 "shared_gate": True}}}):
        layer = configure(MoE)
    params = init(layer, x)
    assert params["shared"]["w_out"].shape == (8, D)
    y = layer.apply({"params": params}, x)
    np.testing.assert_allclose(y, reference(params, x, 2, None, True, shared=True)[0], atol=1e-4, rtol=1e-4)


def test_auxiliary_losses_and_load():
    """Load-balancing loss (Mixtral's formula), z-loss and per-expert shares from the router."""
    layer, params, x = build(top_k=2, capacity_factor=None, aux_loss=0.5, z_loss=0.25)
    _, sown = layer.apply({"params": params}, x, mutable=[AUXILIARY])
    penalty, metrics = auxiliary(sown)
    logits = np.asarray(x, np.float64) @ np.asarray(params["router"], np.float64)
    probs = np.asarray(jax.nn.softmax(logits, -1))
    chosen = np.zeros_like(probs)
    np.put_along_axis(chosen, np.argsort(-probs, -1)[..., :2], 1.0, -1)
    balance = E * np.sum(chosen.mean((0, 1)) * probs.mean((0, 1)))
    z = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
    assert float(metrics["moe/aux_loss"]) == pytest.approx(balance, rel=1e-5)
    assert float(metrics["moe/z_loss"]) == pytest.approx(z, rel=1e-5)
    assert float(penalty) == pytest.approx(0.5 * balance + 0.25 * z, rel=1e-5)
    loads = [float(metrics[f"moe/load_e{i}"]) for i in range(E)]
    assert loads == pytest.approx(list(chosen.mean((0, 1)) / 2), abs=1e-6) and sum(loads) == pytest.approx(1)


def test_flops_count_the_router_and_top_k_experts():
    layer, _, _ = build(top_k=2, shared_d_ff=8)
    seq = 10
    mlp = configure(MLP, d_model=D, d_ff=8)
    assert layer.flops(seq) == 6 * D * E * seq + 6 * 2 * D * 24 * 2 * seq + mlp.flops(seq)


@pytest.mark.slow
@pytest.mark.parametrize("capacity_factor", [1.0, 1.25, None], ids=["capacity1", "capacity1.25", "dropless"])
def test_flops_agree_with_xla_but_for_the_empty_slots(capacity_factor):
    """XLA's count of forward + backward of one sequence is ``flops(seq)`` plus what the
    experts compute on the slots no choice fills, ``n_experts x capacity - top_k x seq`` per
    sequence and layer (none at capacity 1; dropless: ``capacity = seq``), to 5%."""
    swiglu = {"activation": "swiglu", "norm": "rmsnorm", "positions": "rope", "bias": False}
    cfg = {"architecture": {"n_layers": 2, "d_model": 128, "n_heads": 4, "seq_len": 64, "vocab_size": 256,
                            "d_ff": 256, **swiglu, "moe": {"n_experts": 4, "capacity_factor": capacity_factor}}}
    with configuration(cfg):
        model, layer = configure(MoEGPT), configure(MoE)
    seq = model.seq_len
    tokens = jnp.zeros((1, seq), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]

    def loss(p, tokens):
        return cross_entropy(model.apply({"params": p}, tokens), tokens)

    xla = jax.jit(jax.grad(loss)).lower(params, tokens).compile().cost_analysis()["flops"]
    empty = layer.n_experts * layer.capacity(seq) - layer.top_k * seq
    per_slot = 6 * (len(layer.inputs) + 1) * layer.d_model * layer.hidden
    assert empty == {1.0: 0, 1.25: 32, None: 128}[capacity_factor]
    computed = model.flops(seq) + model.n_layers * empty * per_slot
    assert abs(xla - computed) / xla < 0.05, (xla, computed, model.flops(seq))
    if capacity_factor is None:  # dropless: the padding is most of it; the count without it is far off
        assert xla > 1.5 * model.flops(seq)


def tiny(**extra) -> dict:
    return {"architecture": {"n_layers": 4, "d_model": 32, "n_heads": 4, "seq_len": 16, "vocab_size": 64,
                             "moe": {"n_experts": E, **extra.pop("moe", {})}, **extra}}


@pytest.mark.slow
def test_every_nth_layer_is_moe_and_flops_follow():
    with configuration(tiny(moe={"every": 2})):
        model = configure(MoEGPT)
        dense = configure(GPT)
        moe = configure(MoE)
    tokens = jnp.zeros((1, 16), jnp.int32)
    params = model.init(jax.random.key(0), tokens)["params"]
    assert ["router" in params[f"h_{i}"]["mlp"] for i in range(4)] == [False, True, False, True]
    per_layer_dense = configure(MLP, d_model=32).flops(16)
    assert model.flops(16) == dense.flops(16) + 2 * (moe.flops(16) - per_layer_dense)


@pytest.mark.slow
def test_scanned_layers_equal_unrolled_with_their_metrics():
    with configuration(tiny()):
        unrolled = configure(MoEGPT)
        scanned = configure(MoEGPT, scan_layers=True)
    tokens = jax.random.randint(jax.random.key(2), (2, 17), 0, 64)
    params = nn.unbox(unrolled.init(jax.random.key(0), tokens[:, :-1])["params"])
    task = LanguageModeling()
    loss, metrics = task.loss_and_metrics(unrolled, params, tokens, None)
    scan_loss, scan_metrics = task.loss_and_metrics(scanned, stack_layers(params), tokens, None)
    assert float(scan_loss) == pytest.approx(float(loss), rel=1e-5)
    for key, value in metrics.items():
        assert float(scan_metrics[key]) == pytest.approx(float(value), rel=1e-5, abs=1e-7), key


def test_train_loss_adds_the_weighted_auxiliary_losses():
    with configuration(tiny(moe={"aux_loss": 0.1, "z_loss": 0.01})):
        model = configure(MoEGPT)
    tokens = jax.random.randint(jax.random.key(2), (2, 17), 0, 64)
    params = model.init(jax.random.key(0), tokens[:, :-1])["params"]
    loss, metrics = LanguageModeling().loss_and_metrics(model, params, tokens, None)
    ce = cross_entropy(model.apply({"params": params}, tokens[:, :-1]), tokens[:, 1:])
    assert float(metrics["lm_loss"]) == pytest.approx(float(ce), rel=1e-6)
    assert float(loss) == pytest.approx(float(ce + 0.1 * metrics["moe/aux_loss"] + 0.01 * metrics["moe/z_loss"]),
                                        rel=1e-6)
    with configuration(tiny()):
        dense = configure(GPT)
    dense_params = dense.init(jax.random.key(0), tokens[:, :-1])["params"]
    dense_loss, dense_metrics = LanguageModeling().loss_and_metrics(dense, dense_params, tokens, None)
    assert dense_metrics == {}
    assert float(dense_loss) == float(LanguageModeling().loss(dense, dense_params, tokens, None))


def test_a_user_block_takes_moe_through_mlp_cls():
    """The existing hook: a Block subclass whose mlp_cls is MoE, in a GPT subclass; the plan
    gains the expert axis and the task sees its routing."""

    class MyBlock(Block):
        mlp_cls = MoE

    class MyGPT(GPT):
        block_cls = MyBlock

    with configuration(tiny()):
        model = configure(MyGPT)
    assert model.plan()["expert"] == "expert" and MoE in MyGPT.gather()
    tokens = jax.random.randint(jax.random.key(2), (2, 17), 0, 64)
    params = model.init(jax.random.key(0), tokens[:, :-1])["params"]
    _, metrics = LanguageModeling().loss_and_metrics(model, params, tokens, None)
    assert {f"moe/load_e{i}" for i in range(E)} <= set(metrics)
    assert MoEBlock.mlp_cls is MoE


@pytest.mark.parametrize("moe, extra, message", [
    ({"top_k": 5}, {}, "architecture.moe.top_k must be in [1, architecture.moe.n_experts=4], got 5"),
    ({"capacity_factor": 0.0}, {}, "architecture.moe.capacity_factor must be positive (or null: dropless)"),
    ({"n_experts": 0}, {}, "architecture.moe.n_experts must be positive, got 0"),
    ({"every": 2}, {"scan_layers": True}, "architecture.scan_layers=true repeats one block, but architecture.moe.every=2"),
])
def test_bad_settings_are_config_errors(moe, extra, message):
    cfg = tiny(moe=moe, **extra)
    with configuration(cfg), pytest.raises(ConfigError) as err:
        model = configure(MoEGPT)
        model.init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32))
    assert message in str(err.value)


@pytest.mark.slow
def test_dropless_decoding_through_the_cache_equals_the_full_pass():
    """Generation: a token routes alone, so dropless chunks through the KV cache give the full
    pass's logits, and greedy generation is the argmax of full passes."""
    with configuration(tiny(moe={"capacity_factor": None, "every": 2})):
        model = configure(MoEGPT)
    tokens = jax.random.randint(jax.random.key(3), (2, 12), 0, 64)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), tokens)["params"])
    forward = jax.jit(model.apply)  # jitted: op by op, the MoE's many small operations take seconds each pass
    full = forward({"params": params}, tokens)
    decoder = model.clone(decode=True)
    shapes = jax.eval_shape(decoder.init, jax.random.key(0), tokens)["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    decode = jax.jit(functools.partial(decoder.apply, mutable=["cache"]))
    chunks = []
    for start, stop in [(0, 5), (5, 6), (6, 12)]:
        logits, variables = decode({"params": params, "cache": cache}, tokens[:, start:stop])
        cache = variables["cache"]
        chunks.append(logits)
    np.testing.assert_allclose(jnp.concatenate(chunks, axis=1), full, atol=1e-4)
    out = generate(model, params, tokens[:, :4], max_new_tokens=4, temperature=0.0)
    expected = tokens[:, :4]
    for _ in range(4):
        expected = jnp.concatenate([expected, forward({"params": params}, expected)[:, -1:].argmax(-1)], axis=1)
    np.testing.assert_array_equal(out, expected)


def test_route_bias_chooses_the_experts_and_the_gates_stay_unbiased():
    layer, params, x = build(top_k=2, capacity_factor=None, bias_update_rate=0.01)
    assert float(jnp.abs(params["b_route"]).max()) == 0  # initialised to zero
    unbiased, _ = reference({k: v for k, v in params.items() if k != "b_route"}, x, 2, None, swiglu=False)
    assert np.allclose(layer.apply({"params": params}, x), unbiased, atol=1e-4)
    # a bias of 2 on expert 3 makes it every token's choice (probabilities are below 1)
    biased = {**params, "b_route": jnp.array([0.0, 0.0, 0.0, 2.0])}
    y, sown = layer.apply({"params": biased}, x, mutable=[AUXILIARY])
    _, metrics = auxiliary(sown)
    assert float(metrics["moe/load_e3"]) == pytest.approx(0.5)
    assert float(metrics["moe/bias_e3"]) == 2.0
    logits = np.asarray(x, np.float64) @ np.asarray(params["router"], np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    other = np.argmax(np.where(np.arange(E) == 3, -1, probs), -1)  # the best of the rest
    expected = np.zeros_like(np.asarray(x, np.float64))
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    for b, s in np.ndindex(*x.shape[:2]):
        gates = probs[b, s, [3, other[b, s]]] / probs[b, s, [3, other[b, s]]].sum()
        for gate, e in zip(gates, [3, other[b, s]], strict=True):
            expected[b, s] += gate * expert_mlp(np.asarray(x[b, s], np.float64), p, False, e)
    assert np.allclose(y, expected, atol=1e-4)


@pytest.mark.slow
def test_route_bias_gradient_is_the_load_imbalance_and_the_loss_unchanged():
    with configuration(tiny(moe={"bias_update_rate": 0.01})):
        model = configure(MoEGPT)
    with configuration(tiny()):
        plain = configure(MoEGPT)
    tokens = jax.random.randint(jax.random.key(2), (2, 17), 0, 64)
    params = model.init(jax.random.key(0), tokens[:, :-1])["params"]
    task = LanguageModeling()
    (loss, metrics), grads = jax.value_and_grad(lambda p: task.loss_and_metrics(model, p, tokens, None),
                                                has_aux=True)(params)
    no_bias = jax.tree.map(lambda p: p, params)
    for block in no_bias.values():
        if isinstance(block, dict) and "mlp" in block:
            del block["mlp"]["b_route"]
    assert float(loss) == float(task.loss_and_metrics(plain, no_bias, tokens, None)[0])
    _, sown = model.apply({"params": params}, tokens[:, :-1], mutable=[AUXILIARY])
    layers = [name for name in params if isinstance(params[name], dict) and "mlp" in params[name]]
    assert len(layers) == 4
    for name in layers:
        routing = sown[AUXILIARY][name]["mlp"]["routing"][0]
        load = jnp.stack([routing[f"moe/load_e{i}"] for i in range(E)])
        np.testing.assert_allclose(nn.unbox(grads[name]["mlp"]["b_route"]), (load - 1 / E) / len(layers), atol=1e-7)


def test_a_model_of_moe_layers_that_does_not_update_their_routing_bias_is_refused():
    """A user's GPT of MoE blocks with bias-balanced routing but no rule for the bias: its init
    says so in one line (the optimizer would train the bias as a weight); MoEGPT's passes."""
    class MyGPT(GPT):
        block_cls = MoEBlock

    tokens = jnp.zeros((1, 8), jnp.int32)
    with configuration(tiny(moe={"bias_update_rate": 0.01})):
        mine, theirs = configure(MyGPT), configure(MoEGPT)
    with pytest.raises(ConfigError, match="architecture.moe.bias_update_rate is set, but MyGPT declares no "
                                          "bias_update_rate for the train step to apply: subclass MoEGPT"):
        jax.eval_shape(mine.init, jax.random.key(0), tokens)
    params = jax.eval_shape(theirs.init, jax.random.key(0), tokens)["params"]
    assert all("b_route" in params[f"h_{i}"]["mlp"] for i in range(4))
