"""BaseModule: the stateful compile / params / serialize contract.

A BaseModule owns its trainable parameters and state, is compiled for an input shape, is
callable, changes precision and serializes. Its forward pass is the pure function that
``_get_callable()`` returns::

    fn(params, input_NF, training, state, rng) -> (output_NF, new_state)

which ``jax.jit`` (``training`` static) and ``jax.grad`` take as it is. Hyperparameters are
``field()``s: every subclass is made a dataclass of its fields (keeping its own ``__init__``
if it writes one), so they are config keys too and ``get_hyperparameters`` /
``set_hyperparameters`` work over them. Classes are found among the imported subclasses by
name (``resolve``), never imported from a file. ``theseus.stateful.model.Model`` chains them.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

import theseus
from theseus.config.context import check
from theseus.config.fields import specs

Array = jax.Array
Forward = Callable[[tuple, Array, bool, tuple, Any], tuple[Array, tuple]]
T = TypeVar("T")

SERIALIZED_KEYS = ("name", "version", "hyperparameters", "params", "state")

_PRECISIONS = {
    **dict.fromkeys(("float32", "complex64", "single", "f32", "c64", 32), 32),
    **dict.fromkeys(("float64", "complex128", "double", "f64", "c128", 64), 64),
}


class BaseModule:
    """Base class for all Modules. Custom modules should inherit from this class.

    Subclasses override ``is_ready``, ``_get_callable``, ``compile``, ``get_output_shape``,
    ``get_params`` and ``set_params`` (and ``get_state`` / ``set_state`` if they keep state);
    they must construct with no arguments, so that a saved Model can rebuild them.
    """

    _written_init = False  # True below a class that writes __init__ by hand (kept for its subclasses)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls._written_init = True
        dataclasses.dataclass(cls, init=not cls._written_init, eq=False, repr=False)
        signature = inspect.signature(cls.__init__)
        required = [p.name for p in list(signature.parameters.values())[1:]
                    if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if required:
            raise TypeError(
                f"{cls.__qualname__}() requires {', '.join(required)}: a BaseModule must construct "
                "with no arguments (give every hyperparameter a default)"
            )

    def __init__(self) -> None:
        """BaseModule constructor, must be overridden by subclasses: always raises NotImplementedError."""
        raise NotImplementedError("BaseModule is not meant to be instantiated directly: subclass it")

    # -- to override ------------------------------------------------------------------------

    def is_ready(self) -> bool:
        """True if the module is initialized and ready for training or inference."""
        raise NotImplementedError(f"{type(self).__name__} must implement is_ready()")

    def _get_callable(self) -> Forward:
        """The pure forward pass ``(params, input_NF, training, state, rng) -> (output_NF, new_state)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement _get_callable()")

    def compile(self, rng: Any, input_shape: tuple[int, ...]) -> None:
        """Initialise params and state for inputs of shape ``(N, *input_shape)`` from ``rng``."""
        raise NotImplementedError(f"{type(self).__name__} must implement compile()")

    def get_output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The per-sample output shape for a per-sample ``input_shape``; ValueError if it cannot take it."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_output_shape()")

    def get_params(self) -> tuple[Array, ...]:
        """The trainable parameters (``()`` for a module without any)."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_params()")

    def set_params(self, params: tuple[Array, ...]) -> None:
        """Replace the trainable parameters."""
        raise NotImplementedError(f"{type(self).__name__} must implement set_params()")

    # -- defaults ---------------------------------------------------------------------------

    def name(self) -> str:
        """The module's name: its class name unless overridden."""
        return type(self).__name__

    def __repr__(self) -> str:
        """``Linear(88 trainable floats, ready)``, ``ReLU(ready)``, ``Linear(not ready)``."""
        floats = self.get_num_trainable_floats()
        status = "ready" if self.is_ready() else "not ready"
        return f"{self.name()}({f'{floats} trainable floats, ' if floats else ''}{status})"

    def __call__(self, input_NF: Array, training: bool = False, state: tuple[Array, ...] = (),
                 rng: Any = None) -> tuple[Array, tuple[Array, ...]]:
        """The output ``[N, ...]`` and new state for ``input_NF: [N, ...]`` with the current params.

        ``state=()`` (the default) runs with the module's own state, ``get_state()``. The new
        state is returned, not stored. ValueError if the module is not ready.
        """
        if not self.is_ready():
            raise ValueError(f"{self.name()} is not ready: call compile(rng, input_shape) first")
        return self._get_callable()(self.get_params(), jnp.asarray(input_NF), training, state or self.get_state(), rng)

    def get_hyperparameters(self) -> dict[str, Any]:
        """The hyperparameters: the dataclass fields (the ``field()``s), by attribute name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def set_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        """Set hyperparameters (by attribute name) with setattr; config fields are type-checked.

        TypeError if ``hyperparameters`` is not a dict; ValueError for a name that is not a
        hyperparameter or a value a config field rejects.
        """
        if not isinstance(hyperparameters, dict):
            raise TypeError(f"hyperparameters must be a dict, got {type(hyperparameters).__name__}")
        known = self.get_hyperparameters()
        unknown = sorted(set(hyperparameters) - set(known))
        if unknown:
            raise ValueError(f"{self.name()} has no hyperparameter {', '.join(unknown)}; it has {', '.join(known) or 'none'}")
        fields = {spec.name: spec for spec in specs(type(self))}
        for name, value in hyperparameters.items():
            setattr(self, name, check(fields[name], value) if name in fields else value)

    def get_num_trainable_floats(self) -> int | None:
        """Trainable floats (a complex number counts as two); None if the module is not ready."""
        if not self.is_ready():
            return None
        leaves = jax.tree.leaves(self.get_params())
        return sum(leaf.size * (2 if jnp.iscomplexobj(leaf) else 1) for leaf in leaves
                   if jnp.issubdtype(leaf.dtype, jnp.inexact))

    def get_state(self) -> tuple[Array, ...]:
        """The non-trainable state updated by forward passes (e.g. batch statistics); ``()`` if none."""
        return ()

    def set_state(self, state: tuple[Array, ...]) -> None:
        """Replace the state; a module without state accepts only ``()``."""
        if tuple(state):
            raise ValueError(f"{self.name()} has no state, got {len(tuple(state))} arrays")

    def set_precision(self, prec: np.dtype | str | int) -> None:
        """Cast params and state to 32- or 64-bit precision (real stays real, complex complex).

        ``prec``: np.float32, np.complex64, "float32", "complex64", "single", "f32", "c64" or
        32; np.float64, np.complex128, "float64", "complex128", "double", "f64", "c128" or 64.
        ValueError for another value, or 64 bits while JAX_ENABLE_X64 is off; RuntimeError if
        the module is not ready.
        """
        bits = precision_bits(prec)
        if not self.is_ready():
            raise RuntimeError(f"{self.name()} is not ready: call compile(rng, input_shape) before set_precision")
        self.set_params(_cast(self.get_params(), bits))
        self.set_state(_cast(self.get_state(), bits))

    def astype(self, dtype: np.dtype | str | int) -> BaseModule:
        """``set_precision(dtype)``, returning the module itself."""
        self.set_precision(dtype)
        return self

    def serialize(self) -> dict[str, Any]:
        """``{"name", "version", "hyperparameters", "params", "state"}``, arrays as numpy arrays."""
        return {
            "name": self.name(),
            "version": theseus.__version__,
            "hyperparameters": self.get_hyperparameters(),
            "params": jax.tree.map(np.asarray, self.get_params()),
            "state": jax.tree.map(np.asarray, self.get_state()),
        }

    def deserialize(self, data: dict[str, Any]) -> None:
        """Set hyperparameters, params and state from ``serialize()``'s dict.

        ValueError if a key is missing, the data was written by an incompatible theseus
        version, or it serializes another module.
        """
        if not isinstance(data, dict):
            raise ValueError(f"serialized {self.name()} must be a dict, got {type(data).__name__}")
        missing = [key for key in SERIALIZED_KEYS if key not in data]
        if missing:
            raise ValueError(f"serialized {self.name()} lacks {', '.join(missing)} (expected {', '.join(SERIALIZED_KEYS)})")
        if not compatible(data["version"]):
            raise ValueError(
                f"serialized {self.name()} was written by theseus {data['version']!r}, "
                f"which theseus {theseus.__version__} cannot read"
            )
        if data["name"] != self.name():
            raise ValueError(f"serialized data is a {data['name']!r}, not a {self.name()!r}")
        self.set_hyperparameters(data["hyperparameters"])
        self.set_params(data["params"])
        self.set_state(data["state"])


def precision_bits(prec: Any) -> int:
    """32 or 64 for a precision ``set_precision`` accepts; ValueError (or for 64 bits while
    JAX_ENABLE_X64 is off)."""
    key = prec
    if not isinstance(prec, str | int) and prec is not None:
        try:
            key = np.dtype(prec).name
        except (TypeError, ValueError):
            key = None
    bits = _PRECISIONS.get(key)
    if bits is None:
        raise ValueError(
            f"invalid precision {prec!r}: use 32 (np.float32, np.complex64, 'float32', 'complex64', 'single', "
            "'f32', 'c64') or 64 (np.float64, np.complex128, 'float64', 'complex128', 'double', 'f64', 'c128')"
        )
    if bits == 64 and not jax.config.jax_enable_x64:
        raise ValueError("64-bit precision needs JAX_ENABLE_X64=1 (or jax.config.update('jax_enable_x64', True))")
    return bits


def compatible(version: Any) -> bool:
    """Whether data written by theseus ``version`` reads in this one: the same major version
    (and, before 1.0, the same minor)."""
    if not isinstance(version, str):
        return False

    def release(v: str) -> list[str]:
        major, minor = (v.split(".") + [""])[:2]
        return [major, minor] if major == "0" else [major]

    return release(version) == release(theseus.__version__)


def qualified_name(cls: type) -> str:
    """``package.module.QualName``: how a saved file names a class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def resolve(base: type[T], name: str) -> type[T]:
    """The subclass of ``base`` called ``name`` (see qualified_name) among those already
    imported: looked up, never imported. ValueError if there is none."""
    found = [cls for cls in _subclasses(base) if qualified_name(cls) == name]
    if not found:
        raise ValueError(f"unknown {base.__name__} class {name!r}: import the module that defines it before loading")
    return found[-1]  # the latest definition (a module reloaded in a notebook)


def _subclasses(cls: type) -> Iterator[type]:
    """Every subclass of ``cls``, depth first, in definition order."""
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _cast(tree: Any, bits: int) -> Any:
    def cast(leaf: Array) -> Array:
        leaf = jnp.asarray(leaf)
        if jnp.iscomplexobj(leaf):
            return leaf.astype(jnp.complex64 if bits == 32 else jnp.complex128)
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.astype(jnp.float32 if bits == 32 else jnp.float64)
        return leaf

    return jax.tree.map(cast, tree)
