"""The MLP nonlinearities ``architecture.activation`` chooses: GELU, or a gated one (SwiGLU, GeGLU).

Shapes: each of ``h`` is ``[..., hidden]``, the hidden units' pre-activations.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax

GATES: dict[str, Callable[[jax.Array], jax.Array]] = {  # a gated MLP's activation of its gate
    "swiglu": jax.nn.silu, "geglu": functools.partial(jax.nn.gelu, approximate=True)}
ACTIVATIONS = ("gelu", *GATES)  # architecture.activation


def input_projections(activation: str) -> tuple[str, ...]:
    """An MLP's input projections, each a weight ``w_{name}``: a gated one's gate and up (its
    value), GELU's up alone."""
    return ("gate", "up") if activation in GATES else ("up",)


def activate(h: list[jax.Array], activation: str) -> jax.Array:
    """An MLP's hidden units from its ``input_projections``: ``gate(h[0]) * h[1]`` (SwiGLU:
    silu, GeGLU: tanh-approximated gelu, as Gemma's ``gelu_pytorch_tanh``) or ``gelu(h[0])``."""
    return GATES[activation](h[0]) * h[1] if activation in GATES else jax.nn.gelu(h[0], approximate=True)
