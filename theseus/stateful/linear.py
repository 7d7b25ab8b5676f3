"""Linear: the affine map ``y = x W + b``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from theseus.config import field
from theseus.stateful.base import Forward
from theseus.stateful.params import Parametric


class Linear(Parametric):
    """``x: [N, F] -> x W + b: [N, width]``; params ``(W [F, width], b [width])`` (no b without bias).

    W starts LeCun-normal (variance 1/F), b at zero.
    """

    width: int = field("architecture.linear.width", default=1, help="output features of a Linear module")
    bias: bool = field("architecture.linear.bias", default=True, help="add a bias to a Linear module's output")

    def get_output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(input_shape) != 1:
            raise ValueError(f"Linear expects input shape (features,), got {tuple(input_shape)} (put a Flatten before it)")
        return (self.width,)

    def init(self, rng: Any, input_shape: tuple[int, ...]) -> tuple[jax.Array, ...]:
        (features,) = input_shape
        w = jax.random.normal(rng, (features, self.width), jnp.float32) / jnp.sqrt(features)
        return (w, jnp.zeros(self.width, jnp.float32)) if self.bias else (w,)

    def check_params(self, params: tuple[jax.Array, ...]) -> None:
        got = [p.shape for p in params]
        bias = [(self.width,)] * int(self.bias)
        if not (len(got) == 1 + len(bias) and len(got[0]) == 2 and got[0][1] == self.width and got[1:] == bias):
            expected = f"(W [F, {self.width}]{f', b [{self.width}]' if self.bias else ''})"
            raise ValueError(f"Linear(width={self.width}, bias={self.bias}) takes params {expected}, got shapes {got}")

    def _get_callable(self) -> Forward:
        return linear


def linear(params: tuple[jax.Array, ...], x: jax.Array, training: bool, state: tuple, rng: Any):
    """``x [N, F] @ W [F, O] (+ b [O])``; state passes through."""
    w, *b = params
    y = x @ w
    return (y + b[0] if b else y), state
