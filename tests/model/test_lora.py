"""LoRA: adapters start as the base model, compute their merged weights, shard with their
weights, and are all the optimizer trains; bad targets are refused in one line."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec

from theseus.config import ConfigError, configuration, configure
from theseus.model.lora import merged, settings_of, without_adapters
from theseus.model.models.gpt import GPT
from theseus.model.models.moe_gpt import MoEGPT
from theseus.training.optimizer import Adafactor, AdamW, Muon, make_optimizer

GPT2_STYLE = {"positions": "learned"}
LLAMA_STYLE = {"positions": "rope", "norm": "rmsnorm", "activation": "swiglu", "bias": False, "n_kv_heads": 2}
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 12)), jnp.int32)


def build(style: dict, cls: type = GPT, **lora) -> GPT:
    arch = {"vocab_size": 64, "seq_len": 16, "n_layers": 1, "d_model": 32, "n_heads": 4, "d_ff": 48,
            "dtype": {"activation": "float32"}, **style, "lora": lora}
    with configuration({"architecture": arch}):
        return configure(cls)


def flat(tree) -> dict:
    return traverse_util.flatten_dict(nn.unbox(tree), sep="/")


def params_of(model: GPT, randomise: bool = False) -> dict:
    """``model``'s initial params; ``randomise``: the adapters' B drawn too (a trained adapter's stand-in)."""
    params = flat(jax.jit(model.init)(jax.random.key(0), TOKENS)["params"])
    rng = np.random.default_rng(1)
    return traverse_util.unflatten_dict({path: jnp.asarray(rng.normal(0, 0.3, leaf.shape), leaf.dtype)
                                         if randomise and "/lora_" in path else leaf
                                         for path, leaf in params.items()}, sep="/")


def moments(state) -> int:
    """The entries of an optimizer state's arrays (its scalar counts aside)."""
    return sum(leaf.size for leaf in jax.tree.leaves(nn.unbox(state)) if leaf.ndim)


def logits(model: GPT, *params: dict) -> list[np.ndarray]:
    """The model's logits with each param tree (one compile)."""
    apply = jax.jit(model.apply)
    return [np.asarray(apply({"params": tree}, TOKENS)) for tree in params]


@pytest.mark.slow
@pytest.mark.parametrize("style", [GPT2_STYLE, LLAMA_STYLE], ids=["gpt2", "llama"])
def test_adapters_start_as_the_base_and_compute_their_merged_weights(style):
    """Step 0 (B = 0) is the base bit for bit; with B drawn, the adapted model computes
    ``W + alpha / rank A B`` (its own forward against the merged weights in the plain model)."""
    targets = ["q", "k", "v", "o", "gate", "up", "down"] if style is LLAMA_STYLE else ["q", "o", "up", "down"]
    model = build(style, rank=4, alpha=6.0, targets=targets)
    initial, trained = params_of(model), params_of(model, randomise=True)
    plain = without_adapters(model)
    base = traverse_util.unflatten_dict({path: leaf for path, leaf in flat(initial).items() if "/lora_" not in path},
                                        sep="/")
    assert flat(jax.eval_shape(plain.init, jax.random.key(0), TOKENS)["params"]).keys() == flat(base).keys()
    assert settings_of(model).scale == 1.5
    at_start, adapted = logits(model, initial, trained)
    plain_logits, merged_logits = logits(plain, base, merged(trained, 1.5))
    np.testing.assert_array_equal(at_start, plain_logits)
    assert np.abs(adapted - plain_logits).max() > 1e-2
    np.testing.assert_allclose(adapted, merged_logits, atol=1e-5, rtol=0)


def test_gpt2_style_adapts_q_k_v_as_one_llama_style_each_projection():
    gpt2 = flat(jax.eval_shape(build(GPT2_STYLE, rank=4).init, jax.random.key(0), TOKENS)["params"])
    assert sorted(path for path in gpt2 if path.startswith("h_0/") and "lora" in path) == \
        ["h_0/attn/lora_qkv/a", "h_0/attn/lora_qkv/b_k", "h_0/attn/lora_qkv/b_q", "h_0/attn/lora_qkv/b_v"]
    llama = flat(jax.eval_shape(build(LLAMA_STYLE, rank=4).init, jax.random.key(0), TOKENS)["params"])
    assert {path: leaf.shape for path, leaf in llama.items() if path.startswith("h_0/") and "lora" in path} == {
        "h_0/attn/lora_q/a": (32, 4), "h_0/attn/lora_q/b": (4, 4, 8),
        "h_0/attn/lora_v/a": (32, 4), "h_0/attn/lora_v/b": (4, 2, 8)}


def test_adapters_shard_with_their_weights():
    """Each adapter carries its weight's logical axes (the rank replicated): under the GPT's plan
    (embed over fsdp, heads and MLP width over tensor) it splits as its weight does."""
    model = build(LLAMA_STYLE, rank=4, targets=["q", "o", "up", "down"])
    boxed = jax.eval_shape(model.init, jax.random.key(0), TOKENS)["params"]
    specs = flat(model.plan().specs(boxed))
    assert {path: spec for path, spec in specs.items() if path.startswith("h_0/") and "lora" in path} == {
        "h_0/attn/lora_q/a": PartitionSpec("fsdp", None), "h_0/attn/lora_q/b": PartitionSpec(None, "tensor", None),
        "h_0/attn/lora_o/a": PartitionSpec("tensor", None, None), "h_0/attn/lora_o/b": PartitionSpec(None, "fsdp"),
        "h_0/mlp/lora_up/a": PartitionSpec("fsdp", None), "h_0/mlp/lora_up/b": PartitionSpec(None, "tensor"),
        "h_0/mlp/lora_down/a": PartitionSpec("tensor", None), "h_0/mlp/lora_down/b": PartitionSpec(None, "fsdp")}
    assert specs["h_0/attn/wq"] == PartitionSpec("fsdp", "tensor", None)


@pytest.mark.slow
def test_only_the_adapters_train():
    """AdamW with weight decay and clipping: state for the adapters alone, the base bit for bit
    the same after a step, the adapters moved; without adapters every weight trains."""
    model = build(LLAMA_STYLE, rank=4, targets=["q", "down"])
    tx, _ = make_optimizer(AdamW(lr=1e-2, weight_decay=0.5, clip_norm=1e-3, warmup_steps=0), 10)
    boxed = jax.jit(model.init)(jax.random.key(0), TOKENS)["params"]
    params = nn.unbox(boxed)
    state = tx.init(boxed)
    adapters = sum(leaf.size for path, leaf in flat(params).items() if "/lora_" in path)
    assert moments(state) == 2 * adapters  # Adam's two moments
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(grads, nn.unbox(state), params)
    after = flat(optax.apply_updates(params, updates))
    for path, leaf in flat(params).items():
        moved = not np.array_equal(np.asarray(after[path]), np.asarray(leaf))
        assert moved == ("/lora_" in path), path

    plain = without_adapters(model)
    plain_params = jax.eval_shape(plain.init, jax.random.key(0), TOKENS)["params"]
    everything = sum(leaf.size for leaf in jax.tree.leaves(nn.unbox(plain_params)))
    assert moments(jax.eval_shape(tx.init, plain_params)) == 2 * everything


@pytest.mark.slow
def test_muon_and_adafactor_train_the_adapters_alone():
    model = build(LLAMA_STYLE, rank=4, targets=["q", "o", "up", "down"])
    boxed = model.init(jax.random.key(0), TOKENS[:, :4])["params"]
    params = nn.unbox(boxed)
    for option in (Muon, Adafactor):  # their own masks and factored state
        tx, _ = make_optimizer(option(warmup_steps=0), 10)
        updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), nn.unbox(tx.init(boxed)), params)
        after = flat(optax.apply_updates(params, updates))
        assert all(np.array_equal(after[path], leaf) != ("/lora_" in path) for path, leaf in flat(params).items()), \
            option.__name__


@pytest.mark.parametrize(("style", "cls", "targets", "message"), [
    (GPT2_STYLE, GPT, ["q", "x"], ("architecture.lora.targets has 'x', which is not a projection: choose among q, k, "
                                   "v, o, gate, up, down (e.g. architecture.lora.targets=[q,v])")),
    (GPT2_STYLE, GPT, ["gate"], ("architecture.lora.targets has 'gate', but this model's layers have no such "
                                 "projection (they have up, down): drop it from architecture.lora.targets")),
])
def test_a_target_the_model_lacks_is_refused(style, cls, targets, message):
    with pytest.raises(ConfigError) as error:
        jax.eval_shape(build(style, cls, rank=4, targets=targets).init, jax.random.key(0), TOKENS)
    assert str(error.value) == message


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_adapters_on_a_mixture_of_experts_and_its_experts(scan):
    """Attention and each expert's gate, up and down (one A and B per expert, sharded on the
    experts' axis), with a shared expert adapted as a dense MLP: the adapted model computes the
    plain model with the merged weights."""
    moe = {"n_experts": 4, "top_k": 2, "shared_d_ff": 16}
    model = build({**LLAMA_STYLE, "moe": moe, "scan_layers": scan}, MoEGPT, rank=4,
                  targets=["q", "o", "gate", "up", "down"])
    params = params_of(model, randomise=True)
    layer = "h/mlp" if scan else "h_0/mlp"
    shapes = {path.removeprefix(layer + "/"): leaf.shape for path, leaf in flat(params).items()
              if path.startswith(layer) and "lora_" in path}
    lead = (1,) if scan else ()
    assert shapes == {f"lora_expert_{t}/{ab}": (*lead, 4, *dims) for t, (a, b) in
                      {"gate": ((32, 4), (4, 48)), "up": ((32, 4), (4, 48)), "down": ((48, 4), (4, 32))}.items()
                      for ab, dims in (("a", a), ("b", b))} | {
        f"shared/lora_{t}/{ab}": (*lead, *dims) for t, (a, b) in
        {"gate": ((32, 4), (4, 16)), "up": ((32, 4), (4, 16)), "down": ((16, 4), (4, 32))}.items()
        for ab, dims in (("a", a), ("b", b))}
    if not scan:
        boxed = jax.eval_shape(model.init, jax.random.key(0), TOKENS)["params"]
        assert flat(model.plan().specs(boxed))["h_0/mlp/lora_expert_up/a"] == PartitionSpec("expert", "fsdp", None)
    plain = without_adapters(model)
    adapted, = logits(model, params)
    assert np.abs(adapted - logits(model, params_of(model))[0]).max() > 1e-2  # the experts' adapters count
    np.testing.assert_allclose(adapted, *logits(plain, merged(params, settings_of(model).scale)), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_lora_step_differentiates_the_adapters_alone():
    """The train step as the trainer compiles it: ``grad_norm`` is the norm of the adapters'
    gradients (``jax.grad`` of the loss with respect to them alone, the base held fixed), the
    adapters move by the optimizer's update of those gradients, and the base leaves bit for bit."""
    import functools

    from theseus.tasks.lm import LanguageModeling
    from theseus.model.lora import trainable
    from theseus.training.state import TrainState
    from theseus.training.step import train_step

    model = build(LLAMA_STYLE, rank=4, targets=["q", "v", "down"])
    params = params_of(model, randomise=True)  # B drawn: A's gradient is not zero
    tx, schedule = make_optimizer(AdamW(lr=1e-2, weight_decay=0.5, clip_norm=None, warmup_steps=0), 10)
    zero = jnp.zeros((), jnp.int32)
    state = TrainState(step=zero, params=params, opt_state=tx.init(params), nonfinite=zero, first_nonfinite=zero)
    task, key = LanguageModeling(), jax.random.key(0)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 64, (1, 2, 17)), jnp.int32)
    step = jax.jit(functools.partial(train_step, model=model, task=task, tx=tx, schedule=schedule,
                                     trainable=trainable))
    after, metrics = step(state, tokens, key)

    base = {path: leaf for path, leaf in flat(params).items() if "/lora_" not in path}
    adapters = {path: leaf for path, leaf in flat(params).items() if "/lora_" in path}

    def loss(adapters):  # the step's loss of its one micro-batch, the base a constant
        tree = traverse_util.unflatten_dict({**base, **adapters}, sep="/")
        return task.loss_and_metrics(model, tree, tokens[0], jax.random.fold_in(jax.random.fold_in(key, 0), 0))[0]

    grads = jax.grad(loss)(adapters)
    assert set(grads) == set(adapters) and all(np.abs(np.asarray(g)).max() > 0 for g in grads.values())
    np.testing.assert_allclose(float(metrics["grad_norm"]), float(optax.global_norm(grads)), rtol=1e-5)
    moved = flat(after.params)
    for path, leaf in base.items():
        assert np.asarray(moved[path]).tobytes() == np.asarray(leaf).tobytes(), path
    full = traverse_util.unflatten_dict({**jax.tree.map(jnp.zeros_like, base), **grads}, sep="/")
    updates = flat(tx.update(full, tx.init(params), params)[0])
    for path, leaf in adapters.items():
        np.testing.assert_allclose(np.asarray(moved[path]), np.asarray(leaf + updates[path]), rtol=1e-5, atol=1e-7)
