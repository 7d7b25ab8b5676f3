"""The active configuration: ``with configuration(cfg):`` and ``configure(Cls, **kwargs)``.

Values are resolved when an object is built, never when it is called: a model configured
inside ``configuration()`` inits and applies outside it, under ``jax.jit`` or after a reload.

A value is checked against its field once, where it enters: a composed config by
``compose()`` (OmegaConf's schema nodes type it, ``validate`` checks the rest and marks it
checked); a dict configuration or keyword arguments by ``configure()``. A module's children
are built from its own, already checked, field values (``Module.own_configuration``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from theseus.config.errors import ConfigError
from theseus.config.fields import MISSING, FieldSpec, specs, type_name
from theseus.config.schema import schema_of

T = TypeVar("T")


class Snapshot:
    """An immutable, resolved copy of a config: nested plain values, looked up by dotted key.

    Opaque to Flax and JAX (not a pytree, excluded from module comparison), so a module can
    carry it in a dataclass field and re-activate it when its lazy ``setup()`` runs. Equal
    (and hashed) by its values: a block's trace shared by every layer alike (``nn.jit``) is
    keyed by the configuration its children are built from.
    """

    __slots__ = ("_tree", "checked", "_key")

    def __init__(self, cfg: Mapping | DictConfig | None, *, checked: bool = False):
        """``checked``: every value is already its field's (configure() takes them as they are);
        a DictConfig is checked when ``compose()`` marked it so."""
        self.checked = checked or is_checked(cfg)
        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
        tree: dict = {}
        for key, value in (cfg or {}).items():
            _insert(tree, str(key).replace("/", ".").split("."), value)
        self._tree = tree

    @classmethod
    def of(cls, values: Mapping | DictConfig | Snapshot) -> Snapshot:
        """``values`` as a Snapshot: itself, or resolved once (for configuring several parts)."""
        return values if isinstance(values, Snapshot) else cls(values)

    def get(self, key: str) -> Any:
        """The value at dotted ``key``, or MISSING when absent or ``???``."""
        node: Any = self._tree
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return MISSING
            node = node[part]
        return MISSING if node == "???" else node

    def to_dict(self) -> dict:
        return _copy(self._tree)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Snapshot) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def key(self) -> tuple:
        """The values, frozen (nested tuples), and whether they are checked."""
        if not hasattr(self, "_key"):
            self._key = (_frozen(self._tree), self.checked)
        return self._key

    def __repr__(self) -> str:
        return f"Snapshot({self._tree!r}, checked={self.checked})"


def _frozen(node: Any) -> Any:
    """A nested dict or list of plain values as nested tuples (hashable, equal where the values are)."""
    if isinstance(node, Mapping):
        return tuple(sorted((key, _frozen(value)) for key, value in node.items()))
    if isinstance(node, list | tuple):
        return tuple(_frozen(value) for value in node)
    return node


_CHECKED = "theseus_checked"  # the OmegaConf flag compose() sets on a config it has checked


def mark_checked(cfg: DictConfig) -> None:
    """Record on ``cfg`` that its every value has been checked against its field."""
    cfg._set_flag(_CHECKED, True)  # OmegaConf's flags (private, kept to these two functions; tested)


def is_checked(cfg: Any) -> bool:
    return isinstance(cfg, DictConfig) and bool(cfg._get_flag(_CHECKED))


_ACTIVE: contextvars.ContextVar[Snapshot | None] = contextvars.ContextVar("theseus_config", default=None)


def active() -> Snapshot | None:
    """The configuration in force, or None (fields then take their defaults)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def configuration(cfg: Mapping | DictConfig | Snapshot | None) -> Iterator[Snapshot | None]:
    """Make ``cfg`` the active configuration (a dict, flat dotted or nested, or a DictConfig).

    ``None`` activates no configuration: fields take their defaults.
    """
    snapshot = cfg if isinstance(cfg, Snapshot) or cfg is None else Snapshot(cfg)
    token = _ACTIVE.set(snapshot)
    try:
        yield snapshot
    finally:
        _ACTIVE.reset(token)


def configure(cls: type[T], /, **kwargs: Any) -> T:
    """Build ``cls`` with its field values from the active configuration; kwargs win.

    With no active configuration the fields' defaults are used. Inside a Module's ``setup()``
    this builds configured children. A keyword that is not an attribute of ``cls`` sets a key
    of its components() tree for the children that declare it: ``configure(ScaledGPT,
    ff_scale=3.0)`` sets ``architecture.ff_scale`` (by attribute name when one key has it;
    ``**{"architecture.ff_scale": 3.0}`` names the key itself).
    """
    return configured(cls, _ACTIVE.get(), **kwargs)


def configured(cls: type[T], values: Mapping | DictConfig | Snapshot | None, /, **kwargs: Any) -> T:
    """``configure(cls, **kwargs)`` with its values given explicitly (``values``: a resolved
    Snapshot, as a run's spec holds, a dict or a DictConfig; None: the defaults), not taken from
    the active configuration. A Module built so keeps ``values`` for its children."""
    snapshot = None if values is None else Snapshot.of(values)
    own = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(kwargs)
    tree = {name: kwargs.pop(name) for name in list(kwargs) if name not in own}
    if tree:
        overlay = {**(snapshot.to_dict() if snapshot is not None else {}), **tree_keys(cls, tree)}
        snapshot = Snapshot(overlay, checked=snapshot is None or snapshot.checked)
    found = {}
    for spec in specs(cls):
        if spec.name in kwargs:
            continue
        value = snapshot.get(spec.key) if snapshot is not None else MISSING
        if value is MISSING:
            if spec.required:
                raise ConfigError(
                    f"{spec.key} is required by {spec.owner.__name__} ({spec.describe()}): "
                    f"set it, e.g. {spec.key}=VALUE"
                )
            continue
        found[spec.name] = value if snapshot.checked else check(spec, value)
    with configuration(snapshot):  # a Module keeps the configuration it is built under (Module._config)
        return cls(**found, **kwargs)


def tree_keys(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` named by attribute or by dotted key, as dotted keys of ``cls``'s component
    tree, each checked against its field; TypeError for a name the tree does not declare,
    ConfigError for an attribute name that several keys share."""
    schema = schema_of(cls)
    out = {}
    for name, value in values.items():
        keys = [name] if name in schema else sorted({key for key, spec in schema.items() if spec.name == name})
        if not keys:
            raise TypeError(f"{cls.__name__} got an unexpected keyword argument {name!r}: neither one of its "
                            f"fields nor a key of its components() tree (`python -m theseus.config` lists them)")
        if len(keys) > 1:
            raise ConfigError(f"{cls.__name__}: {name}= names several keys of its tree ({', '.join(keys)}): "
                              f"pass the key itself, e.g. **{{{keys[0]!r}: ...}}")
        out[keys[0]] = check(schema[keys[0]], value)
    return out


def check(spec: FieldSpec, value: Any, *, typed: bool = False) -> Any:
    """``value`` converted to the field's type and within its choices; a ConfigError naming the
    key when it is not. ``typed``: its type is checked already (an OmegaConf schema node holds
    it, see ``schema.typed``): only the choices are left."""
    if value is None and (spec.default is None or _optional(spec.type)):
        return None
    if not typed:
        value = _converted(spec, value)
    if spec.choices and value not in spec.choices:
        raise ConfigError(f"{spec.key} must be one of {', '.join(map(str, spec.choices))}, got {value!r}")
    return value


def _converted(spec: FieldSpec, value: Any) -> Any:
    """``value`` as the field's type (an int for a float field is a float); else ConfigError."""
    tp = _plain_type(spec.type)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif tp in (tuple, list) and isinstance(value, tuple | list):
        value = tp(value)
    if tp is not None and not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{spec.key} must be {type_name(spec.type)}, got {value!r} ({spec.describe()})")
    return value


def _plain_type(tp: Any) -> type | None:
    """The runtime class to check against: int for ``int`` and ``int | None``; None for Any."""
    args = [a for a in getattr(tp, "__args__", ()) if a is not type(None)]
    if _optional(tp) and len(args) == 1:
        tp = args[0]
    origin = getattr(tp, "__origin__", None)
    if origin in (list, tuple, dict):
        return origin
    return tp if isinstance(tp, type) else None


def _optional(tp: Any) -> bool:
    return type(None) in getattr(tp, "__args__", ())


def _insert(tree: dict, path: list[str], value: Any) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    if isinstance(value, Mapping):
        node = tree.setdefault(path[-1], {})
        for key, sub in value.items():
            _insert(node, str(key).split("."), sub)
    else:
        tree[path[-1]] = tuple(value) if isinstance(value, list) else value


def _copy(tree: Any) -> Any:
    return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, dict) else tree
