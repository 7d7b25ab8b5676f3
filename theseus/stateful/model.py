"""Model: an ordered chain of BaseModules, itself a BaseModule; compiled by passing each
module's output shape to the next, fitted with ``theseus.stateful.fit``, saved as arrays plus
JSON (``theseus.stateful.archive``, never pickle).
"""

from __future__ import annotations

import json
import textwrap
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

# theseus's own layers, imported so that a saved Model naming them always resolves
from theseus.stateful import adapter, elementwise, flatten, linear, pmm  # noqa: F401
from theseus.stateful.archive import decode, encode
from theseus.stateful.base import Array, BaseModule, Forward, qualified_name, resolve
from theseus.stateful.fit import FitSettings, History, mse, train
from theseus.config.context import configure

if TYPE_CHECKING:
    import optax


class Model(BaseModule):
    """An ordered chain of BaseModules, itself a BaseModule: each module's output feeds the next.

    Params and state are tuples with one entry per module (that module's tuple); the
    hyperparameters name each module's class and its hyperparameters.
    """

    def __init__(self, modules: Sequence[BaseModule] = ()):
        strangers = [type(m).__name__ for m in modules if not isinstance(m, BaseModule)]
        if strangers:
            raise TypeError(f"a Model chains BaseModules, got {', '.join(strangers)}")
        self.modules = list(modules)

    def __repr__(self) -> str:
        lines = [textwrap.indent(f"{i}: {module!r}", "  ") for i, module in enumerate(self.modules)]
        return "\n".join([super().__repr__(), *lines])

    def is_ready(self) -> bool:
        return all(module.is_ready() for module in self.modules)

    def input_shapes(self, input_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The input shape of each module, then the output shape, for the Model's ``input_shape``.

        ValueError naming the module's index, class, the shape it got and why it cannot take it.
        """
        shapes = [tuple(input_shape)]
        for i, module in enumerate(self.modules):
            try:
                shapes.append(tuple(module.get_output_shape(shapes[-1])))
            except ValueError as exc:
                source = f"module {i - 1}'s output" if i else "the Model's input"
                raise ValueError(
                    f"module {i} ({type(module).__name__}) cannot take input shape {shapes[-1]} ({source}): {exc}"
                ) from exc
        return shapes

    def get_output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return self.input_shapes(input_shape)[-1]

    def compile(self, rng: Any, input_shape: tuple[int, ...]) -> None:
        """Compile each module for the output shape of the one before it."""
        shapes = self.input_shapes(input_shape)
        keys = jax.random.split(rng, len(self.modules))
        for module, key, shape in zip(self.modules, keys, shapes[:-1], strict=True):
            module.compile(key, shape)

    def _get_callable(self) -> Forward:
        forwards = [module._get_callable() for module in self.modules]

        def chain(params, x, training, state, rng):
            keys = [None] * len(forwards) if rng is None else list(jax.random.split(rng, len(forwards)))
            new_state = []
            for forward, p, s, key in zip(forwards, params, state, keys, strict=True):
                x, s = forward(p, x, training, s, key)
                new_state.append(s)
            return x, tuple(new_state)

        return chain

    def get_params(self) -> tuple[tuple[Array, ...], ...]:
        return tuple(module.get_params() for module in self.modules)

    def set_params(self, params: Sequence[tuple[Array, ...]]) -> None:
        for module, p in zip(self.modules, self._per_module(params, "params"), strict=True):
            module.set_params(p)

    def get_state(self) -> tuple[tuple[Array, ...], ...]:
        return tuple(module.get_state() for module in self.modules)

    def set_state(self, state: Sequence[tuple[Array, ...]]) -> None:
        for module, s in zip(self.modules, self._per_module(state, "state"), strict=True):
            module.set_state(s)

    def _per_module(self, values: Sequence, what: str) -> Sequence:
        if len(values) != len(self.modules):
            raise ValueError(f"Model has {len(self.modules)} modules, got {what} for {len(values)}")
        return values

    def get_hyperparameters(self) -> dict[str, Any]:
        """``{"modules": [{"class": "package.module.Class", "hyperparameters": {...}}, ...]}``."""
        return {"modules": [{"class": qualified_name(type(m)), "hyperparameters": m.get_hyperparameters()}
                            for m in self.modules]}

    def set_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        """Rebuild the chain: each class (an imported BaseModule, looked up by name), constructed
        with no arguments, then given its hyperparameters. The new modules are not ready."""
        if not isinstance(hyperparameters, dict):
            raise TypeError(f"hyperparameters must be a dict, got {type(hyperparameters).__name__}")
        if set(hyperparameters) != {"modules"}:
            raise ValueError(f"Model hyperparameters are {{'modules': [...]}}, got keys {sorted(hyperparameters)}")
        modules = []
        for spec in hyperparameters["modules"]:
            if not isinstance(spec, dict) or set(spec) != {"class", "hyperparameters"}:
                raise ValueError(f"a Model's module is {{'class': ..., 'hyperparameters': ...}}, got {spec!r}")
            module = resolve(BaseModule, spec["class"])()
            module.set_hyperparameters(spec["hyperparameters"])
            modules.append(module)
        self.modules = modules

    def fit(self, X: Array, Y: Array, *, loss: Callable[[Array, Array], Array] | None = None,
            optimizer: optax.GradientTransformation | None = None, **settings: Any) -> History:
        """Train on ``X: [N, ...] -> Y: [N, ...]`` (see ``theseus.stateful.fit.train``).

        ``settings``: fields of ``FitSettings`` (epochs, batch_size, lr, val_fraction,
        patience, seed); the rest come from the active config, else their defaults.
        ``loss(pred, target)`` defaults to the mean squared error, ``optimizer`` (an optax
        GradientTransformation) to Adam at ``lr``. Compiles the Model first if it is not ready;
        keeps the parameters of the best validation epoch.
        """
        return train(self, X, Y, configure(FitSettings, **settings), loss=loss or mse, optimizer=optimizer)

    def save(self, path: str | Path) -> None:
        """Write the Model to ``path``: a zip of ``metadata.json`` and ``arrays/<i>.npy`` (no pickle)."""
        arrays: list[np.ndarray] = []
        metadata = encode(self.serialize(), arrays)
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("metadata.json", json.dumps(metadata, indent=1))
            for i, array in enumerate(arrays):
                with archive.open(f"arrays/{i}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, array, allow_pickle=False)

    @classmethod
    def load(cls, path: str | Path) -> Model:
        """The Model saved at ``path``. Reading it executes nothing from the file: JSON, plain
        arrays (no pickle) and class names resolved among the imported BaseModules."""
        try:
            with zipfile.ZipFile(path) as archive:
                data = decode(json.loads(archive.read("metadata.json")), archive)
        except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path} is not a saved theseus Model: {exc}") from exc
        model = cls()
        model.deserialize(data)
        return model
