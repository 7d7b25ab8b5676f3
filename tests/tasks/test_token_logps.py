"""token_logps, the loss's core: values and gradients against a float64 numpy reference (float32
and bfloat16 logits, the cross-entropy's ignored targets), and on a TPU's compiled step no
float32 copy of the [tokens, vocab] logits, where autodiff's keeps one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support import tpu_mesh
from theseus.model.layers import dense
from theseus.plan.hlo import INDEX
from theseus.tasks.lm import cross_entropy
from theseus.tasks.token_logps import token_logps


def reference(logits: np.ndarray, targets: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64: ``log_softmax(logits)[target]`` and the gradient of ``sum(g * it)`` by the logits."""
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    onehot = np.arange(logits.shape[-1]) == targets[..., None]
    picked = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    return picked, g[..., None] * (onehot - np.exp(log_probs))


@pytest.mark.parametrize("dtype, tolerance", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_token_logps_and_its_gradient_match_float64(dtype, tolerance):
    """Within ``tolerance`` of the largest magnitude (bfloat16's: its logits and gradient rounded
    to 8 bits of mantissa); the gradient comes back in the logits' dtype."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(4 * rng.standard_normal((3, 5, 300)), dtype)
    targets = jnp.asarray(rng.integers(0, 300, (3, 5)))
    g = rng.standard_normal((3, 5))
    values, vjp = jax.vjp(lambda l: token_logps(l, targets), logits)
    (grad,) = vjp(jnp.asarray(g, jnp.float32))
    expected, expected_grad = reference(np.asarray(logits, np.float64), np.asarray(targets), g)
    assert values.dtype == jnp.float32 and grad.dtype == dtype
    assert np.max(np.abs(values - expected)) <= tolerance * np.max(np.abs(expected))
    assert np.max(np.abs(np.asarray(grad, np.float64) - expected_grad)) <= tolerance * np.max(np.abs(expected_grad))


def test_the_cross_entropys_gradient_ignores_minus_one_targets():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(3 * rng.standard_normal((2, 5, 7)), jnp.float32)
    targets = np.array([[1, 6, -1, 0, 2], [-1, -1, 3, 4, 5]])
    grad = jax.grad(cross_entropy)(logits, jnp.asarray(targets))
    kept = targets != -1
    g = -kept.astype(float) / kept.sum()  # the mean's weight of each kept position
    _, expected = reference(np.asarray(logits, np.float64), np.where(kept, targets, 0), g)
    np.testing.assert_allclose(grad, expected, atol=1e-7)
    assert not np.any(np.asarray(grad)[~kept])


def compiled_head(loss) -> tuple[list[str], float]:
    """The compiled TPU v5e step of ``loss`` (its value and gradient, as a train step takes them)
    through a bfloat16 output head, 4096 positions by 16384 tokens: the instructions whose result
    holds a float32 [4096, 16384], and XLA's bytes accessed."""
    mesh = tpu_mesh({"data": 1})
    x = jax.ShapeDtypeStruct((4096, 256), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((16384, 256), jnp.float32)
    targets = jax.ShapeDtypeStruct((4096,), jnp.int32)

    def head(x, w, targets):
        return loss(dense("bd,vd->bv", x, w, None, jnp.bfloat16), targets)

    with jax.set_mesh(mesh):
        compiled = jax.jit(jax.value_and_grad(head, argnums=(0, 1))).lower(x, w, targets).compile()
    text = compiled.as_text()
    entry = INDEX.sub("", text[text.index("\nENTRY"):])
    return ([line for line in entry.splitlines() if "f32[4096,16384]" in line.split(" fusion(")[0]],
            compiled.cost_analysis()["bytes accessed"])


@pytest.mark.slow
def test_no_float32_logits_in_a_tpu_step_where_autodiff_keeps_them():
    def autodiff(logits, targets):  # the loss as it was: the logits cast, then differentiated
        logits = logits.astype(jnp.float32)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, targets[:, None], -1)[:, 0])

    kept, before = compiled_head(autodiff)
    assert kept  # the matrix product's fusion writes them beside the bfloat16 logits
    none, after = compiled_head(cross_entropy)
    assert none == [] and after < 0.8 * before
