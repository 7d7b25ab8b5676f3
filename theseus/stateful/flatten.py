"""Flatten: ``[N, d1, d2, ...] -> [N, d1 * d2 * ...]``."""

from __future__ import annotations

import math
from typing import Any

import jax

from theseus.stateful.base import Forward
from theseus.stateful.params import Parameterless


class Flatten(Parameterless):
    """Flattens each sample's features into one axis (row-major)."""

    def get_output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return (math.prod(input_shape),)

    def _get_callable(self) -> Forward:
        return flatten


def flatten(params: tuple, x: jax.Array, training: bool, state: tuple, rng: Any):
    return x.reshape(x.shape[0], -1), state
