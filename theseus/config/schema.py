"""Schema derivation: the fields of a set of classes become one nested structured config."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import omegaconf
from omegaconf import DictConfig, OmegaConf

from theseus.config.errors import ConfigError
from theseus.config.fields import MISSING, FieldSpec, gather, specs

Schema = dict[str, FieldSpec]  # dotted key -> its declaration


def derive(classes: Iterable[type]) -> Schema:
    """The union of the config fields of ``classes``, keyed by dotted key.

    Several classes may declare one key (that is how components share a hyperparameter);
    their types, defaults and roles must agree, else a ConfigError names the key and both
    classes. A help or a role one of them gives is the key's.
    """
    schema: Schema = {}
    for cls in classes:
        for spec in specs(cls):
            seen = schema.get(spec.key)
            if seen is None:
                schema[spec.key] = spec
            elif seen.owner is not spec.owner:
                _check_agree(seen, spec)
                schema[spec.key] = dataclasses.replace(seen, help=seen.help or spec.help, role=seen.role or spec.role)
    _check_nesting(schema)
    return schema


def keys_with(role: str, *classes: type) -> tuple[str, ...]:
    """The keys of ``classes`` (their union, as ``derive`` makes it) declared with ``role``
    (``field(..., role=SEED)``), in order."""
    return tuple(key for key, spec in derive(classes).items() if spec.role == role)


def schema_of(*roots: type) -> Schema:
    """The schema of everything the component trees of ``roots`` construct."""
    return derive(gather(*roots))


def structured(schema: Schema) -> DictConfig:
    """An OmegaConf config with the schema's defaults, each top-level group typed.

    The root stays a plain dict so that Hydra can merge the groups' nodes into one config;
    below it, nodes are structured (types checked, unknown keys rejected).
    """
    tree = _nest(schema)
    node = OmegaConf.create(
        {name: OmegaConf.structured(_dataclass(name, sub)) if isinstance(sub, dict) else _default(sub).default
         for name, sub in tree.items()}
    )
    for key, spec in schema.items():  # a dict-valued key's entries are its value: any may be set
        if _origin(spec.type) is dict:
            value = OmegaConf.select(node, key)
            if OmegaConf.is_config(value):
                OmegaConf.set_struct(value, False)
    return node


def _origin(tp: Any) -> Any:
    """``dict`` for ``dict``, ``dict[str, int]`` and ``dict | None``; else the type's origin."""
    args = [a for a in getattr(tp, "__args__", ()) if a is not type(None)]
    if isinstance(tp, types.UnionType) or getattr(tp, "__origin__", None) is typing.Union:
        tp = args[0] if len(args) == 1 else tp
    return getattr(tp, "__origin__", None) or tp


def _check_agree(a: FieldSpec, b: FieldSpec) -> None:
    where = f"{a.owner.__qualname__}.{a.name} and {b.owner.__qualname__}.{b.name}"
    if a.type != b.type:
        raise ConfigError(f"{a.key} is declared with different types ({a.type} vs {b.type}) by {where}")
    if not _same(a.default, b.default):
        raise ConfigError(
            f"{a.key} is declared with different defaults ({a.default!r} vs {b.default!r}) by {where}"
        )
    if a.role and b.role and a.role != b.role:
        raise ConfigError(f"{a.key} is declared with different roles ({a.role} vs {b.role}) by {where}")


def _same(a: Any, b: Any) -> bool:
    if a is MISSING or b is MISSING:
        return a is b
    return type(a) is type(b) and a == b


def _check_nesting(schema: Schema) -> None:
    for key in schema:
        parts = key.split(".")
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            if prefix in schema:
                raise ConfigError(
                    f"{prefix} is declared as a value by {schema[prefix].owner.__qualname__} "
                    f"and as a group by {schema[key].owner.__qualname__} ({key})"
                )


def _nest(schema: Schema) -> dict:
    tree: dict = {}
    for key, spec in schema.items():
        node = tree
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = spec
    return tree


def _dataclass(path: str, tree: dict) -> type:
    fields = []
    for name, item in tree.items():
        if isinstance(item, dict):
            sub = _dataclass(f"{path}.{name}" if path else name, item)
            fields.append((name, sub, dataclasses.field(default_factory=sub)))
        else:
            fields.append((name, _omegaconf_type(item.type), _default(item)))
    title = "".join(part.title() for part in path.replace(".", "_").split("_")) or "Root"
    return dataclasses.make_dataclass(f"{title}Config", fields)


def _default(spec: FieldSpec) -> dataclasses.Field:
    if spec.required:
        return dataclasses.field(default=omegaconf.MISSING)
    if isinstance(spec.default, list | tuple | dict):
        value = spec.default
        return dataclasses.field(default_factory=lambda: type(value)(value))
    return dataclasses.field(default=spec.default)


def typed(spec: FieldSpec) -> bool:
    """OmegaConf checks the values of ``spec``'s key in a composed config (its schema node has
    the field's type); else ``validate`` does."""
    return _omegaconf_type(spec.type) is not Any


@functools.cache
def _omegaconf_type(tp: Any) -> Any:
    """``tp`` if OmegaConf can validate it, else Any (checked by ``validate`` instead)."""
    if isinstance(tp, types.UnionType):  # OmegaConf reads Optional[X], not X | None
        tp = typing.Union[tp.__args__]  # noqa: UP007
    try:
        OmegaConf.structured(dataclasses.make_dataclass("Probe", [("x", tp, dataclasses.field(default=omegaconf.MISSING))]))
    except Exception:
        return Any
    return tp


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as its dotted keys: ``{"optimizer": {"lr": 1e-3}} -> {"optimizer.lr": 1e-3}``
    (lists stay values)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
