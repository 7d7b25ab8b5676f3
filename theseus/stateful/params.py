"""How a module holds trainable parameters: Parametric (a tuple of arrays) or Parameterless."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from theseus.stateful.base import BaseModule


class Parametric(BaseModule):
    """A module whose trainable parameters are a tuple of arrays, made by ``init``.

    Subclasses write ``get_output_shape``, ``init``, ``check_params`` and ``_get_callable``.
    Ready once ``compile`` or ``set_params`` has given it parameters.
    """

    _params = None  # tuple[jax.Array, ...] once compiled or set (a class default, not a field)

    def init(self, rng: Any, input_shape: tuple[int, ...]) -> tuple[jax.Array, ...]:
        """Fresh float32 parameters for inputs of per-sample shape ``input_shape``."""
        raise NotImplementedError(f"{type(self).__name__} must implement init()")

    def check_params(self, params: tuple[jax.Array, ...]) -> None:
        """ValueError unless ``params`` fit the hyperparameters."""
        raise NotImplementedError(f"{type(self).__name__} must implement check_params()")

    def is_ready(self) -> bool:
        return self._params is not None

    def compile(self, rng: Any, input_shape: tuple[int, ...]) -> None:
        self.get_output_shape(input_shape)
        self.set_params(self.init(rng, tuple(input_shape)))

    def get_params(self) -> tuple[jax.Array, ...]:
        """The parameters; RuntimeError before compile() or set_params()."""
        if self._params is None:
            raise RuntimeError(f"{self.name()} has no parameters yet: call compile(rng, input_shape) first")
        return self._params

    def set_params(self, params: tuple[jax.Array, ...]) -> None:
        params = tuple(jnp.asarray(p) for p in params)
        self.check_params(params)
        self._params = params


class Parameterless(BaseModule):
    """A module without trainable parameters or state: always ready, compiling is a no-op."""

    def is_ready(self) -> bool:
        return True

    def compile(self, rng: Any, input_shape: tuple[int, ...]) -> None:
        """Nothing to initialise (checks that ``input_shape`` is acceptable)."""
        self.get_output_shape(input_shape)

    def get_params(self) -> tuple[jax.Array, ...]:
        return ()

    def set_params(self, params: tuple[jax.Array, ...]) -> None:
        """Accepts only ``()``."""
        if tuple(params):
            raise ValueError(f"{self.name()} has no trainable parameters, got {len(tuple(params))} arrays")

