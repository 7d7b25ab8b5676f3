"""task=grpo's mathematics against TRL 1.x (and its loss on a Llama against TRL's on transformers'): ``group_advantages`` against the advantage lines of
``GRPOTrainer._generate_and_score_completions`` (with TRL's own ``nanstd``), and ``policy_loss``
and its gradient against ``GRPOTrainer._compute_loss`` run by torch autograd, on handcrafted
inputs: mu = 2 (old log-probs that differ, so the ratio is not 1), clipping active on both
sides, beta 0 and 0.04, every loss type, one batch and an accumulated step.

``_compute_loss`` is called unbound, on a namespace holding the settings it reads and a
``_get_per_token_logps_and_entropies`` that returns the log-probs chosen here (the cheapest
faithful way: the method's own code computes the loss, its normalisers and its metrics; only
the model's forward is replaced, and the log-probs of logits are tested on their own)."""

from __future__ import annotations

import contextlib
import types
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.tasks.grpo import LOSS_TYPES, advantages_by_prompt, clamp, group_advantages, policy_loss

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
from trl.trainer.utils import nanstd  # noqa: E402

G = 4  # completions per prompt


def trl_advantages(rewards: np.ndarray, num_generations: int, scale_rewards: str,
                   zero_std: bool = False) -> np.ndarray | tuple[np.ndarray, float]:
    """The advantage lines of TRL's ``_generate_and_score_completions`` (one reward function,
    ``sum_then_normalize``), as written there; ``zero_std``: with its ``frac_reward_zero_std``."""
    rewards = torch.tensor(rewards, dtype=torch.float32)
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
        std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    else:
        std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    advantages = torch.nan_to_num(advantages, nan=0.0).numpy()
    return (advantages, is_std_zero.float().mean().item()) if zero_std else advantages


REWARDS = np.array([1.0, 0.0, 0.5, 2.0,               # a group of four
                    1.0, 1.0, 1.0, 1.0,               # all equal: std 0, advantages 0
                    np.nan, 3.0, -1.0, 0.25,          # one unscorable
                    np.nan, np.nan, 7.0, np.nan,      # a single scorable reward
                    np.nan, np.nan, np.nan, np.nan],  # none scorable
                   np.float32)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_group_advantages_are_trls(scale_rewards):
    ours = np.asarray(group_advantages(REWARDS, G, scale_rewards))
    np.testing.assert_allclose(ours, trl_advantages(REWARDS, G, scale_rewards), rtol=1e-5, atol=1e-5)
    assert np.all(ours[8::4] == 0) and np.all(ours[12:] == 0)  # unscorable, alone, none scorable: 0
    assert np.all(ours[4:8] == 0)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_the_tasks_advantages_and_zero_std_share_are_trls(scale_rewards):
    from theseus.tasks.grpo import GroupRelativePolicyOptimization

    task = GroupRelativePolicyOptimization(reward="unused:unused", num_generations=G, scale_rewards=scale_rewards)
    advantages, zero = task.advantages(REWARDS, np.repeat(np.arange(len(REWARDS) // G), G))
    expected, expected_zero = trl_advantages(REWARDS, G, scale_rewards, zero_std=True)
    np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-5)
    assert zero == pytest.approx(expected_zero) and (scale_rewards == "batch" or zero == 0.2)  # one group of five


def test_group_advantages_use_bessels_std_and_eps():
    rewards = np.array([0.0, 1.0], np.float32)  # mean 0.5, sample std sqrt(0.5)
    expected = np.array([-0.5, 0.5]) / (np.sqrt(0.5) + 1e-4)
    np.testing.assert_allclose(np.asarray(group_advantages(rewards, 2)), expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(group_advantages(rewards, 2, eps=1e-8)), expected * (np.sqrt(0.5) + 1e-4) /
                               (np.sqrt(0.5) + 1e-8), rtol=1e-6)


def test_clamp_passes_the_gradient_on_its_boundary_as_torch_does():
    x = np.array([0.5, 0.8, 1.0, 1.2, 1.5], np.float32)
    ours = np.asarray(jax.grad(lambda v: jnp.sum(clamp(v, 1 - 0.2, 1 + 0.2)))(jnp.asarray(x)))
    t = torch.tensor(x, requires_grad=True)
    torch.clamp(t, 1 - 0.2, 1 + 0.2).sum().backward()
    np.testing.assert_array_equal(ours, t.grad.numpy())
    assert ours.tolist() == [0, 1, 1, 1, 0]
    halved = np.asarray(jax.grad(lambda v: jnp.sum(jnp.clip(v, 1 - 0.2, 1 + 0.2)))(jnp.asarray(x)))
    assert halved[1] == halved[3] == 0.5  # what the issue warns of: jnp.clip's boundary


def handcrafted(n: int = 8, width: int = 6, seed: int = 0) -> dict[str, np.ndarray]:
    """Log-probs of ``n`` completions of up to ``width`` tokens: the policy's, the old policy's
    (mu = 2: a step was taken since sampling, ratios spread past both clip bounds) and the
    reference's; advantages of both signs, one 0; completions of lengths 1 .. width."""
    rng = np.random.default_rng(seed)
    logps = rng.uniform(-3.0, -0.1, (n, width)).astype(np.float32)
    old = (logps + rng.normal(0.0, 0.3, (n, width))).astype(np.float32)
    ref = (logps + rng.normal(0.0, 0.5, (n, width))).astype(np.float32)
    lengths = 1 + np.arange(n) % width
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int32)
    advantages = rng.normal(0.0, 1.0, n).astype(np.float32)
    advantages[3] = 0.0
    # one token exactly on each clip boundary: ratio = 1.2 (A > 0) and 0.8 (A < 0)
    advantages[0], advantages[1] = 1.5, -0.7
    old[0, 0], logps[0, 0] = 0.0, np.float32(np.log(np.float32(1.2)))
    old[1, 0], logps[1, 0] = 0.0, np.float32(np.log(np.float32(0.8)))
    ratio = np.exp(logps - old)
    assert (mask * (ratio > 1.2)).any() and (mask * (ratio < 0.8)).any()  # clipping on both sides
    return {"logps": logps, "old": old, "ref": ref, "mask": mask, "advantages": advantages}


def trl_loss(inputs: dict[str, np.ndarray], *, loss_type: str, beta: float, epsilon: float, epsilon_high: float,
             max_completion_length: int, grad_accum: int = 1, num_items: int | None = None):
    """``GRPOTrainer._compute_loss`` on ``inputs`` (one micro-batch of a step of ``grad_accum``
    whose completions hold ``num_items`` tokens): its loss, the gradient of the loss with respect
    to the policy's log-probs, and its metrics."""
    logps = torch.tensor(inputs["logps"], requires_grad=True)
    mask = torch.tensor(inputs["mask"])
    n, width = mask.shape
    metrics = defaultdict(list)
    accelerator = types.SimpleNamespace(num_processes=1, reduce=lambda x, reduction: x, gather=lambda x: x)
    args = types.SimpleNamespace(use_bias_correction_kl=True, delta=None, steps_per_generation=grad_accum)
    trainer = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=beta, args=args, loss_type=loss_type, epsilon_low=epsilon,
        epsilon_high=epsilon_high, use_vllm=False, vllm_importance_sampling_correction=False,
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=grad_accum,
        accelerator=accelerator, _entropy_bonus_enabled=False, _metrics={"train": metrics},
        max_completion_length=max_completion_length)
    batch = {"prompt_ids": torch.ones((n, 2), dtype=torch.long), "prompt_mask": torch.ones((n, 2), dtype=torch.long),
             "completion_ids": torch.ones((n, width), dtype=torch.long), "completion_mask": mask,
             "advantages": torch.tensor(inputs["advantages"]), "old_per_token_logps": torch.tensor(inputs["old"]),
             "num_items_in_batch": torch.tensor(num_items if num_items is not None else int(mask.sum()))}
    if beta:
        batch["ref_per_token_logps"] = torch.tensor(inputs["ref"])
    loss = trl.GRPOTrainer._compute_loss(trainer, None, batch)
    loss.backward()
    return loss.item(), logps.grad.numpy(), {key: values[-1] for key, values in metrics.items()}


def ours(inputs: dict[str, np.ndarray], **settings):
    def loss(logps):
        return policy_loss(logps, jnp.asarray(inputs["old"]), jnp.asarray(inputs["ref"]) if settings["beta"] else None,
                           jnp.asarray(inputs["advantages"]), jnp.asarray(inputs["mask"]), **settings)

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(inputs["logps"]))
    return float(value), np.asarray(grad), {key: float(v) for key, v in metrics.items()}


@pytest.mark.parametrize(("loss_type", "beta", "epsilon_high"),
                         [(loss_type, beta, 0.2) for loss_type in LOSS_TYPES for beta in (0.0, 0.04)]
                         + [("dapo", 0.04, 0.28)])
def test_policy_loss_and_its_gradient_are_trls(loss_type, beta, epsilon_high):
    """Rows 0 and 1 hold a token whose ratio is exactly 1 + epsilon (A > 0) and 1 - epsilon
    (A < 0): the clamp passes its gradient there, as torch's does."""
    inputs = handcrafted()
    settings = dict(loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=epsilon_high, max_completion_length=10)
    expected_loss, expected_grad, expected = trl_loss(inputs, **settings)
    loss, grad, metrics = ours(inputs, **settings)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["clip_ratio"], expected["clip_ratio/region_mean"], rtol=1e-5)
    assert metrics["clip_ratio"] > 0
    if beta:
        np.testing.assert_allclose(metrics["kl"], expected["kl"], rtol=1e-5)
    else:
        assert "kl" not in metrics and "kl" not in expected


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_an_accumulated_step_is_normalised_as_trls(loss_type):
    """Two micro-batches of unequal token counts: the step's loss (each micro-batch's / grad_accum,
    summed, as theseus's train step sums them) and gradient equal TRL's over the same micro-batches."""
    inputs = handcrafted(n=8, width=6, seed=1)
    halves = [{key: value[rows] for key, value in inputs.items()} for rows in (slice(0, 3), slice(3, 8))]
    halves[0]["advantages"] = inputs["advantages"][:3]
    tokens = int(inputs["mask"].sum())
    settings = dict(loss_type=loss_type, beta=0.04, epsilon=0.2, epsilon_high=0.2, max_completion_length=6)
    expected = [trl_loss(half, **settings, grad_accum=2, num_items=tokens) for half in halves]
    got = [ours(half, **settings, num_items=tokens / 2) for half in halves]
    np.testing.assert_allclose(sum(loss for loss, _, _ in got) / 2, sum(loss for loss, _, _ in expected),
                               rtol=1e-5, atol=1e-6)
    for (_, grad, _), (_, expected_grad, _) in zip(got, expected, strict=True):
        np.testing.assert_allclose(grad / 2, expected_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_shuffled_completions_keep_their_advantages(scale_rewards):
    """Each completion's group is found by its prompt's id: the completions of a step in any order
    (as devices and micro-batches may hold them) get the advantages they get in TRL's layout."""
    ids = np.repeat(np.array([40, 7, 13, 2, 99]), G)  # each prompt's completions consecutive, as sampled
    expected = np.asarray(group_advantages(REWARDS, G, scale_rewards))
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(len(ids))
        shuffled = advantages_by_prompt(REWARDS[order], ids[order], G, scale_rewards)
        np.testing.assert_array_equal(shuffled, expected[order])
    mixed = advantages_by_prompt(REWARDS, np.roll(ids, 1), G, scale_rewards)  # groups taken by position: wrong
    assert not np.allclose(mixed, expected)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_the_task_loss_on_a_llama_is_trls_on_transformers(tmp_path, loss_type):
    """The task's loss of completions (log-probs of logits / temperature, from theseus's forward of
    a Llama) equals ``_compute_loss`` with TRL's own forward of the same weights in transformers
    (``add_fused_lm_head`` at that temperature), mu = 2 and beta 0.04."""
    from interop.hf_models import llama_config, save_hf, theseus_model, target_of

    from theseus.interop.hf_config import arch_of
    from theseus.sources.weights import load_params
    from theseus.sources.parse import parse_source
    from theseus.tasks.grpo import GroupRelativePolicyOptimization

    transformers = pytest.importorskip("transformers")
    folder = save_hf(transformers.LlamaForCausalLM(llama_config()), tmp_path / "llama", tokenizer=False)
    model = theseus_model(folder)
    params = load_params(parse_source(folder, key=None), arch_of(model), target_of(model, 32))
    n, prompt, width, temperature = 6, 5, 7, 0.7
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, 333, (n, prompt))
    completions = rng.integers(0, 333, (n, width))
    lengths = np.array([7, 1, 3, 7, 5, 2])
    mask = (np.arange(width) < lengths[:, None]).astype(np.int64)
    completions = completions * mask  # 0 after each completion's end, as the rollout lays them out
    inputs = handcrafted(n, width, seed=2)
    task = GroupRelativePolicyOptimization(reward="unused:unused", max_completion_length=width,
                                           temperature=temperature, beta=0.04, num_iterations=2, loss_type=loss_type)
    window = np.zeros((n, 32 + 1), np.int32)
    window[:, :prompt], window[:, prompt:prompt + width] = prompts, completions
    batch = {"tokens": jnp.asarray(window), "prompt": jnp.full(n, prompt, jnp.int32),
             "completion": jnp.asarray(lengths, jnp.int32), "advantage": jnp.asarray(inputs["advantages"]),
             "items": jnp.full(n, float(mask.sum()), jnp.float32), "old": jnp.asarray(inputs["old"][:, :width]),
             "reference": jnp.asarray(inputs["ref"][:, :width])}
    loss, metrics = task.loss_and_metrics(model, params, batch, None)

    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    trl.trainer.utils.add_fused_lm_head(hf, temperature=temperature, outputs=("log_probs", "entropy"))
    stub = types.SimpleNamespace(
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=0.04, loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.2,
        args=types.SimpleNamespace(use_bias_correction_kl=True, delta=None, steps_per_generation=1),
        use_vllm=False, vllm_importance_sampling_correction=False, model=hf, current_gradient_accumulation_steps=1,
        accelerator=types.SimpleNamespace(num_processes=1, reduce=lambda x, reduction: x, gather=lambda x: x,
                                          autocast=contextlib.nullcontext, is_main_process=True),
        _entropy_bonus_enabled=False, _metrics={"train": defaultdict(list)}, max_completion_length=width)
    stub._get_per_token_logps_and_entropies = types.MethodType(trl.GRPOTrainer._get_per_token_logps_and_entropies,
                                                                stub)
    hf.train()  # TRL's mode, for its "train" metrics (the weights have no dropout)
    expected = trl.GRPOTrainer._compute_loss(stub, hf, {
        "prompt_ids": torch.tensor(prompts), "prompt_mask": torch.ones((n, prompt), dtype=torch.long),
        "completion_ids": torch.tensor(completions), "completion_mask": torch.tensor(mask),
        "advantages": torch.tensor(inputs["advantages"]), "old_per_token_logps": torch.tensor(inputs["old"][:, :width]),
        "ref_per_token_logps": torch.tensor(inputs["ref"][:, :width]), "num_items_in_batch": torch.tensor(mask.sum())})
    np.testing.assert_allclose(float(loss), expected.item(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(metrics["kl"]), stub._metrics["train"]["kl"][-1], rtol=1e-4)
    np.testing.assert_allclose(float(metrics["clip_ratio"]), stub._metrics["train"]["clip_ratio/region_mean"][-1])


@pytest.mark.parametrize("key, value, message", [
    ("grpo.num_generations", 1, r"grpo.num_generations must be 2 or more, got 1"),
    ("grpo.max_completion_length", 0, r"grpo.max_completion_length must be positive, got 0"),
    ("grpo.temperature", 0.0, r"grpo.temperature must be positive, got 0.0"),
    ("grpo.top_p", 0.0, r"grpo.top_p must be in \(0, 1\], got 0.0"),
    ("grpo.top_p", 1.5, r"grpo.top_p must be in \(0, 1\], got 1.5"),
    ("grpo.top_k", -1, r"grpo.top_k must be 0 or more, got -1"),
    ("grpo.beta", -0.1, r"grpo.beta must be 0 or more, got -0.1"),
    ("grpo.epsilon", 0.0, r"grpo.epsilon must be in \(0, 1\), got 0.0"),
    ("grpo.epsilon", 1.0, r"grpo.epsilon must be in \(0, 1\), got 1.0"),
    ("grpo.epsilon_high", 0.0, r"grpo.epsilon_high must be positive, got 0.0"),
    ("grpo.num_iterations", 0, r"grpo.num_iterations must be 1 or more, got 0"),
    ("grpo.loss_type", "ppo", r"grpo.loss_type must be one of dapo, grpo, bnpo, dr_grpo, got 'ppo'"),
    ("grpo.scale_rewards", "std", r"grpo.scale_rewards must be one of group, batch, none, got 'std'"),
    ("grpo.reward_weights", [1.0, 2.0], r"grpo.reward_weights has 2 weight\(s\) for 1 reward function\(s\) "
                                        r"\(rewards:correct\)"),
    ("grpo.reward", None, r"task=grpo needs grpo.reward: a reward function, e.g. grpo.reward=rewards:correct"),
])
def test_every_key_at_its_bounds_is_one_line(key, value, message):
    """Each refused as its task is configured, before anything is imported or read."""
    from theseus.config import ConfigError, configuration, configure
    from theseus.tasks.grpo import GroupRelativePolicyOptimization

    with configuration({"grpo.reward": "rewards:correct", key: value}), pytest.raises(ConfigError, match=f"^{message}"):
        configure(GroupRelativePolicyOptimization)
    task = configure(GroupRelativePolicyOptimization, reward="rewards:correct", num_generations=2, top_p=1.0,
                     epsilon=0.999, num_iterations=1)  # the edges inside
    with pytest.raises(ConfigError, match=r"trainer.batch_size=6 counts completions: it must divide by "
                                          r"grpo.num_generations=2 x the 2 processes, e.g. trainer.batch_size=4"):
        task.check_batch(6, 1, 2)
