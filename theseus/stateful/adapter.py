"""FlaxAdapter: any theseus Flax ``Module`` presented as a BaseModule."""

from __future__ import annotations

import inspect
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.config import MISSING, configuration, configure, schema_of, specs
from theseus.config.registry import load
from theseus.stateful.base import BaseModule, Forward, precision_bits, qualified_name, resolve
from theseus.model.module import Module

DTYPE_KEYS = tuple(spec.key for spec in specs(Module))  # architecture.dtype.param and .activation


class FlaxAdapter(BaseModule):
    """A theseus ``Module`` as a BaseModule: ``compile`` is ``module.init``, the forward pass
    ``module.apply``.

    Params are the leaves of the ``params`` collection, state the leaves of every other
    collection (e.g. ``batch_stats``), each in ``jax.tree`` flatten order: dict keys sorted,
    depth first (for a GELU ``MLP``: ``b_out, b_up, w_out, w_up``). ``training`` is passed as
    ``deterministic=not training`` to a module whose ``__call__`` takes ``deterministic``, and
    updates the state collections; ``rng`` is the ``dropout`` stream.

    Hyperparameters: ``module`` (the class's qualified name), ``config`` (the value of every
    key in the module's schema, children's included) and ``input_shape`` (set by compile).
    """

    def __init__(self, module: Module | None = None):
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"FlaxAdapter wraps a theseus Module, got {type(module).__name__}")
        self._configure(module, None)

    def _configure(self, module: Module | None, input_shape: tuple[int, ...] | None) -> None:
        """Set the wrapped module and input shape; params and state are cleared."""
        self.module, self.input_shape = module, input_shape
        self._params: tuple[jax.Array, ...] | None = None
        self._state: tuple[jax.Array, ...] = ()
        self._layout: Layout | None = None

    def is_ready(self) -> bool:
        return self._params is not None

    def get_hyperparameters(self) -> dict[str, Any]:
        if self.module is None:
            return {"module": None, "config": {}, "input_shape": self.input_shape}
        return {"module": qualified_name(type(self.module)), "config": module_config(self.module),
                "input_shape": self.input_shape}

    def set_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        """Rebuild the module (its class looked up among the imported theseus Modules) under
        ``config``; keys not given keep their values. Clears params and state."""
        if not isinstance(hyperparameters, dict):
            raise TypeError(f"hyperparameters must be a dict, got {type(hyperparameters).__name__}")
        merged = {**self.get_hyperparameters(), **hyperparameters}
        if set(merged) != {"module", "config", "input_shape"}:
            raise ValueError(f"FlaxAdapter hyperparameters are module, config and input_shape, got {sorted(hyperparameters)}")
        module = None
        if merged["module"] is not None:
            load()  # theseus's own Modules are always resolvable
            with configuration(merged["config"]):
                module = configure(resolve(Module, merged["module"]))
        shape = merged["input_shape"]
        self._configure(module, None if shape is None else tuple(shape))

    def get_output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return self._abstract(tuple(input_shape))[0].shape[1:]

    def compile(self, rng: Any, input_shape: tuple[int, ...]) -> None:
        self.get_output_shape(input_shape)
        variables = nn.meta.unbox(self.module.init(rng, jnp.zeros((1, *input_shape), jnp.float32)))
        self._configure(self.module, tuple(input_shape))
        self.set_params(jax.tree.leaves(variables["params"]))
        self.set_state(jax.tree.leaves({c: v for c, v in variables.items() if c != "params"}))

    def get_params(self) -> tuple[jax.Array, ...]:
        """The ``params`` leaves; RuntimeError before compile() or set_params()."""
        if self._params is None:
            raise RuntimeError(f"{self.name()} has no parameters yet: call compile(rng, input_shape) first")
        return self._params

    def set_params(self, params: tuple[jax.Array, ...]) -> None:
        self._params = self.layout().check("params", params)

    def get_state(self) -> tuple[jax.Array, ...]:
        return self._state

    def set_state(self, state: tuple[jax.Array, ...]) -> None:
        self._state = self.layout().check("state", state)

    def set_precision(self, prec: Any) -> None:
        """Cast params and state, and rebuild the module with matching param and activation dtypes."""
        super().set_precision(prec)
        dtype = f"float{precision_bits(prec)}"
        params, state = self.get_params(), self.get_state()
        self.set_hyperparameters({"config": {**module_config(self.module), **dict.fromkeys(DTYPE_KEYS, dtype)}})
        self.set_params(params)
        self.set_state(state)

    def _get_callable(self) -> Forward:
        module, layout = self.module, self.layout()
        deterministic = "deterministic" in inspect.signature(type(module).__call__).parameters

        def apply(params: tuple, x: jax.Array, training: bool, state: tuple, rng: Any):
            variables = {"params": layout.params.unflatten(params), **layout.state.unflatten(state)}
            kwargs = {"deterministic": not training} if deterministic else {}
            rngs = {"dropout": rng} if rng is not None else {}
            if training and state:
                y, updates = module.apply(variables, x, rngs=rngs, mutable=list(layout.collections), **kwargs)
                return y, tuple(jax.tree.leaves(updates))
            return module.apply(variables, x, rngs=rngs, **kwargs), state

        return apply

    def layout(self) -> Layout:
        """The tree structure and leaf shapes of params and state for ``input_shape``."""
        if self.module is None or self.input_shape is None:
            raise RuntimeError(f"{self.name()} needs a module and an input_shape: compile(rng, input_shape) first")
        if self._layout is None:
            self._layout = Layout(nn.meta.unbox(self._abstract(self.input_shape)[1]))
        return self._layout

    def _abstract(self, input_shape: tuple[int, ...]) -> tuple[jax.ShapeDtypeStruct, dict]:
        """The output and variables of ``init`` on ``[1, *input_shape]``, as shapes only."""
        if self.module is None:
            raise RuntimeError("FlaxAdapter has no module: FlaxAdapter(module) or set_hyperparameters({'module': ...})")
        x = jax.ShapeDtypeStruct((1, *input_shape), jnp.float32)
        try:
            return jax.eval_shape(lambda x: self.module.init_with_output(jax.random.key(0), x), x)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{type(self.module).__name__} cannot take input shape {input_shape}: "
                             f"{str(exc).splitlines()[0]}") from exc


class Layout:
    """Where the leaves of params and state go: tree definitions and expected leaf shapes."""

    def __init__(self, variables: dict):
        params, state = variables["params"], {c: v for c, v in variables.items() if c != "params"}
        self.params, self.state = jax.tree.structure(params), jax.tree.structure(state)
        self.collections = tuple(state)
        self.shapes = {"params": [leaf.shape for leaf in jax.tree.leaves(params)],
                       "state": [leaf.shape for leaf in jax.tree.leaves(state)]}

    def check(self, what: str, leaves: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        """``leaves`` as a tuple of arrays; ValueError unless their shapes are the expected ones."""
        leaves = tuple(jnp.asarray(leaf) for leaf in leaves)
        if [leaf.shape for leaf in leaves] != self.shapes[what]:
            raise ValueError(f"expected {what} of shapes {self.shapes[what]} (jax.tree order), "
                             f"got {[leaf.shape for leaf in leaves]}")
        return leaves


def module_config(module: Module) -> dict[str, Any]:
    """The value of every key in ``module``'s schema: its own fields, else the config it was
    built under, else the defaults (required keys nowhere set are left out)."""
    own = {spec.key: getattr(module, spec.name) for spec in specs(type(module))}
    config = {}
    for key, spec in schema_of(type(module)).items():
        value = own.get(key, MISSING)
        if value is MISSING and module._config is not None:
            value = module._config.get(key)
        if value is MISSING:
            value = spec.default
        if value is not MISSING:
            config[key] = value
    return config
