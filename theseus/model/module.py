"""Module: a flax.linen.Module whose hyperparameters are config fields.

It adds to Linen: ``components()`` (the configurable child types), dtypes from config,
a ``sharding`` plan over logical axes, ``flops(seq)`` (what a step computes: a frozen weight's
gradient is not), and two channels from a model to the
train step that name no model family: what its layers sow into ``AUXILIARY`` (a penalty added
to the objective, metrics logged beside the loss; ``auxiliary``) and parameters the step
updates by a rule of their own instead of the optimizer (``outside_optimizer``). Values are
resolved when the module is built; the configuration in force then travels with the module (through Flax's
clones) and is active again while its lazy ``setup()`` builds children.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import ShardingPlan, gathered_for_use, merge
from theseus.base.hardware import backend
from theseus.config.context import Snapshot, active, configuration, configure
from theseus.config.fields import RUNTIME, Configurable, check_ranges, field, specs

M = TypeVar("M", bound="Module")
DTYPES = ("float32", "bfloat16", "float16", "float64")
# The collection a layer sows its training-only outputs into: dicts holding ``penalty`` (a
# weighted float32 scalar the objective adds) and named float32 scalar metrics (``moe/z_loss``).
AUXILIARY = "auxiliary"
PENALTY = "penalty"
Rule = Callable[[jax.Array, jax.Array], jax.Array]  # (parameter, its gradient) -> the new parameter
# While ``flops(seq, trainable=mask)`` runs: the mask (params' tree of Python bools), else None (all train)
_TRAINABLE: contextvars.ContextVar[Any] = contextvars.ContextVar("trainable", default=None)
# While an init is traced for its shapes alone (``shapes_only``): True
_SHAPES_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("shapes_only", default=False)


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Trace an init for its shapes alone (``jax.eval_shape``): no parameter's value is drawn,
    so a model may build itself as it does to apply (``GPT``'s layers share one trace) rather
    than as its values are drawn (each layer from its own path's key)."""
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def param_shapes(model: nn.Module, seq_len: int) -> Any:
    """The parameters' ShapeDtypeStructs (unboxed), traced without allocating: what a
    checkpoint's weights must match before anything is compiled."""
    tokens = jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
    with shapes_only():
        params = jax.eval_shape(lambda t: model.init(jax.random.key(0), t, deterministic=True)["params"], tokens)
    return nn.unbox(params)


def model_of(module: nn.Module) -> nn.Module | None:
    """The model ``module`` is part of (its outermost parent), or None where it cannot be seen:
    from inside a layer traced apart from the model (GPT's ``traced_once``, a lifted
    transform), whose outermost parent sits below the model's root."""
    root = module
    while isinstance(root.parent, nn.Module):
        root = root.parent
    return root if root.scope is None or not root.scope.path else None


def drawing_values(module: nn.Module) -> bool:
    """Whether ``module`` is initialising its parameters' values (not traced for shapes alone)."""
    return module.is_initializing() and not _SHAPES_ONLY.get()


class Module(nn.Module, Configurable):
    """Base class of theseus model components: hyperparameters as ``field()``s, children named
    by ``components()``, its ``sharding`` plan and ``flops(seq)``; the README's "Your own model"
    shows one."""

    param_dtype: str = field(
        "architecture.dtype.param", default="float32", choices=DTYPES, kw_only=True,
        help="dtype of the stored (master) parameters", role=RUNTIME,
    )
    activation_dtype: str = field(
        "architecture.dtype.activation", default="auto", choices=("auto", *DTYPES), kw_only=True,
        help="dtype of activations and matmuls; auto: bfloat16 on GPU/TPU, float32 on CPU", role=RUNTIME,
    )
    matmul_dtype: str = field(
        "architecture.dtype.matmul", default="auto", choices=("auto", *DTYPES), kw_only=True,
        help="dtype of the weights' matrix products' inputs, accumulated in float32 and returned in the activation "
             "dtype (bfloat16: a CPU's AVX512_BF16 or AMX units; the losses change); auto: the activation dtype",
        role=RUNTIME,
    )
    # The configuration in force when this module was built (None: defaults). A dataclass
    # field, so that Flax's clones keep it; excluded from comparison, hashing and repr.
    _config: Snapshot | None = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)

    def __init_subclass__(cls, **kwargs):
        for name, method in list(cls.__dict__.items()):
            if name == "setup" or getattr(method, "compact", False):  # where children are built
                setattr(cls, name, _in_own_configuration(method))
        for name in ("flops", "flops_note"):
            if name in cls.__dict__:
                setattr(cls, name, _bound_for_flops(cls.__dict__[name]))
        super().__init_subclass__(**kwargs)

    def __post_init__(self):
        check_ranges(self)  # each field within its declared range
        if self._config is None:
            object.__setattr__(self, "_config", active())
        super().__post_init__()

    @property
    def _param_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def _activation_dtype(self) -> jnp.dtype:
        if self.activation_dtype == "auto":
            return jnp.dtype(jnp.float32 if backend() == "cpu" else jnp.bfloat16)
        return jnp.dtype(self.activation_dtype)

    @property
    def _matmul_dtype(self) -> jnp.dtype:
        return self._activation_dtype if self.matmul_dtype == "auto" else jnp.dtype(self.matmul_dtype)

    @property
    def sharding(self) -> ShardingPlan:
        """Logical axis -> mesh axes for this module's parameters; empty: replicated."""
        return ShardingPlan()

    def flops(self, seq: int) -> int:
        """Forward + backward FLOPs of one sequence of ``seq`` positions (default 0).

        Called as ``model.flops(seq, trainable=mask)`` (``mask``: the params' tree of bools the
        train step differentiates, ``theseus.training.optimizer.trainable``), a frozen weight's
        gradient is not counted: an override counts its matrix products with ``dense_flops``.
        It may count through its children either way: bound (``self.mlp.flops(seq)``, the
        children ``setup()`` made) or unbound (``self.detached(MLP).flops(seq)``). Called on an
        unbound module, it runs on an abstract binding (``jax.eval_shape`` of ``init``: no
        parameter is allocated), so both kinds compose.
        """
        return 0

    def flops_note(self, seq: int) -> str | None:
        """How ``flops(seq)`` counts what its convention leaves open (the attention's kernel), for
        the start table; None: nothing to say. Called bound or unbound, as ``flops``."""
        return None

    def dense_flops(self, name: str, positions: float) -> int:
        """Forward + backward FLOPs of the products ``x @ W`` of this module's parameter ``name``
        with ``positions`` rows of ``x`` (each row meets every element of W once): per element
        and row 2 forward, 2 for x's gradient and 2 for W's, this last left out when W is frozen
        (not trainable in the mask ``flops(seq, trainable=mask)`` was given)."""
        weight = nn.unbox(self.get_variable("params", name))
        mask = _TRAINABLE.get()
        for key in (*self.scope.path, name) if mask is not None else ():
            mask = mask.get(key, True) if isinstance(mask, Mapping) else mask
        return round((4 if mask is False else 6) * math.prod(weight.shape) * positions)

    def outside_optimizer(self) -> Mapping[str, Rule]:
        """Parameters the train step updates itself, by leaf name: their gradients are taken out
        before clipping and the optimizer (which then leaves them be), and each is replaced by
        ``rule(param, gradient)`` after the update. None by default."""
        return {}

    def plan(self) -> ShardingPlan:
        """The merged plan of this module and every Module type in its components() tree."""
        children = [self.detached(cls) for cls in type(self).gather()[1:] if issubclass(cls, Module)]
        return merge([self.sharding, *(child.sharding for child in children)])

    def own_configuration(self) -> Snapshot:
        """The configuration this module was built under, with its own field values on top.

        Its children are built from it, so that ``GPT(d_model=64)``, or a clone with a field
        changed, builds children that agree with it.
        """
        base = self._config.to_dict() if self._config is not None else {}
        own = {spec.key: getattr(self, spec.name) for spec in specs(type(self))}  # checked when configured
        return Snapshot({**base, **own}, checked=self._config is None or self._config.checked)

    def detached(self, cls: type[M], /, **kwargs) -> M:
        """A child ``cls`` as ``setup()`` would configure it, but unbound (for flops and plans)."""
        with configuration(self.own_configuration()):
            return configure(cls, parent=None, **kwargs)


def _bound_for_flops(flops):
    """Wrap ``flops`` (or ``flops_note``) so that, called on an unbound module, it runs bound to
    abstract variables, and with ``trainable=mask``, under that mask (``dense_flops`` reads it)."""

    @functools.wraps(flops)
    def wrapped(self, seq: int, trainable: Any = None) -> int:
        if trainable is not None:
            token = _TRAINABLE.set(nn.unbox(trainable))
            try:
                return wrapped(self, seq)
            finally:
                _TRAINABLE.reset(token)
        if self.scope is not None:
            return flops(self, seq)
        counted = []
        jax.eval_shape(lambda: self.init(jax.random.key(0), method=lambda bound: counted.append(flops(bound, seq))))
        return counted[0]

    return wrapped


def _in_own_configuration(method):
    """Wrap ``setup`` (or a compact method) to run under the module's own configuration."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        with configuration(self.own_configuration()):
            return method(self, *args, **kwargs)

    return wrapped


def auxiliary(sown: Mapping[str, Any]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``(penalty, metrics)`` from what a model's layers sowed into ``AUXILIARY`` (the mutable
    collections of an ``apply``): each entry averaged over the layers that sowed it (a scanned
    stack counts each layer); ``(0, {})`` when none did."""
    sites = jax.tree.leaves(sown.get(AUXILIARY, {}), is_leaf=lambda node: isinstance(node, dict) and PENALTY in node)
    if not sites:
        return jnp.zeros((), jnp.float32), {}
    means = {name: jnp.concatenate([jnp.ravel(site[name]) for site in sites if name in site]).mean()
             for name in dict.fromkeys(name for site in sites for name in site)}
    return means.pop(PENALTY), means


def param(module: Module, name: str, init: nn.initializers.Initializer, axes: tuple, shape: tuple) -> jax.Array:
    """A parameter of ``module`` in its param dtype, annotated with logical ``axes``; what the
    layer computes with is gathered over the batch's mesh axes (``gathered_for_use``: FSDP)."""
    return gathered_for_use(module.param(name, nn.with_logical_partitioning(init, axes), shape, module._param_dtype), axes)
