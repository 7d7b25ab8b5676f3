"""Elementwise activations: ``fn`` applied to every element, shapes unchanged."""

from __future__ import annotations

import functools
from typing import Any

import jax

from theseus.stateful.base import Forward
from theseus.stateful.params import Parameterless


class Elementwise(Parameterless):
    """Base of the activations: a subclass sets the class attribute ``fn``, a jax function
    of one array (``fn = staticmethod(jax.nn.relu)``)."""

    def get_output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(input_shape)

    def _get_callable(self) -> Forward:
        fn = self.fn

        def elementwise(params: tuple, x: jax.Array, training: bool, state: tuple, rng: Any):
            return fn(x), state

        return elementwise


class ReLU(Elementwise):
    """``max(x, 0)``."""

    fn = staticmethod(jax.nn.relu)


class Tanh(Elementwise):
    """``tanh(x)``."""

    fn = staticmethod(jax.numpy.tanh)


class Sigmoid(Elementwise):
    """``1 / (1 + exp(-x))``."""

    fn = staticmethod(jax.nn.sigmoid)


class GELU(Elementwise):
    """``x Phi(x)``, Phi the standard normal CDF (exact, not the tanh approximation)."""

    fn = staticmethod(functools.partial(jax.nn.gelu, approximate=False))
