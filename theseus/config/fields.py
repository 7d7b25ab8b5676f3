"""field(): a dataclass attribute bound to a config key; components() and gather().

A hyperparameter is declared once, as a field in the code::

    class Block(Module):
        n_heads: int = field("architecture.n_heads", default=12, help="attention heads")

Its key, type, default and help live there; the Hydra schema is derived from it.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Sequence
from typing import Any

from theseus.config.errors import ConfigError

MISSING = dataclasses.MISSING

_META = "theseus"  # the dataclass metadata entry a config field carries


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One config key as declared by one class."""

    key: str  # dotted: "architecture.n_layers"
    name: str  # the attribute: "n_layers"
    type: Any
    default: Any  # MISSING when required
    help: str
    choices: tuple | None
    owner: type  # the class whose body declares it
    resumable: bool = False  # may change when a run resumes (logging, cadence, layout: not shapes or data)
    check: Range | None = None  # the legal range of a number (None: any)
    role: str | None = None  # SEED, PLANNING or RUNTIME: what the tools that read keys treat it as

    @property
    def required(self) -> bool:
        return self.default is MISSING

    def describe(self, setting: str = "") -> str:
        """``int, default 12: number of blocks`` (for errors and listings); ``setting``, what else
        sets it, after the default: ``int, default 12, +experiment=gpt_small sets 6: ...``."""
        default = "required" if self.required else f"default {self.default!r}"
        choices = f", one of {', '.join(map(str, self.choices))}" if self.choices else ""
        text = f"{type_name(self.type)}, {default}{choices}" + (f", {setting}" if setting else "")
        return f"{text}: {self.help}" if self.help else text


@dataclasses.dataclass(frozen=True)
class Range:
    """The legal values of a number: above ``gt`` or from ``ge``, below ``lt`` or up to ``le``.

    Out of range, ``{key} must be {says}, got {value}: {fix}``: ``says`` defaults to the bounds
    in words (``positive``, ``0 or more``, ``in [0, 1)``), ``fix`` to ``e.g. {key}={default}``.
    None is never out of range (whether a field may be None is its type's business).
    """

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    says: str = ""
    fix: str = ""

    def holds(self, value: Any) -> bool:
        return value is None or not (
            (self.gt is not None and not value > self.gt) or (self.ge is not None and not value >= self.ge)
            or (self.lt is not None and not value < self.lt) or (self.le is not None and not value <= self.le))

    def words(self) -> str:
        """The bounds in words: ``positive``, ``1 or more``, ``in (0, 1)``, ``at most 1``."""
        if self.says:
            return self.says
        low, high = (self.gt if self.gt is not None else self.ge), (self.lt if self.lt is not None else self.le)
        if low is not None and high is not None:
            return f"in {'(' if self.gt is not None else '['}{low:g}, {high:g}{')' if self.lt is not None else ']'}"
        if low is not None:
            return "positive" if self.gt == 0 else f"above {low:g}" if self.gt is not None else f"{low:g} or more"
        return f"below {high:g}" if self.lt is not None else f"at most {high:g}"

    def problem(self, spec: FieldSpec, value: Any) -> str | None:
        """The one-line error for ``value`` of ``spec``'s key, None when it is in range."""
        if self.holds(value):
            return None
        fix = self.fix or (f"e.g. {spec.key}={spec.default!r}" if self.holds(spec.default) and spec.default not in
                           (None, MISSING) else "")
        return f"{spec.key} must be {self.words()}, got {value!r}" + (f": {fix}" if fix else "")


SEED = "seed"  # a random seed: runs that differ only in it are repeats of one setting
PLANNING = "planning"  # asks for a plan instead of a run: a planned point's command to run drops it
RUNTIME = "runtime"  # how a model trains or runs (dropout, kernels, dtypes), not what it computes: export skips it
ROLES = (SEED, PLANNING, RUNTIME)


POSITIVE = Range(gt=0)
NON_NEGATIVE = Range(ge=0)
FRACTION = Range(ge=0, lt=1)  # a rate in [0, 1): dropout, a moment's decay


def check_ranges(obj: Any) -> None:
    """ConfigError naming the first field of ``obj`` (a dataclass) outside its declared range."""
    for spec in specs(type(obj)):
        problem = spec.check and spec.check.problem(spec, getattr(obj, spec.name))
        if problem:
            raise ConfigError(problem)


def field(
    key: str,
    default: Any = MISSING,
    *,
    help: str = "",
    choices: Sequence | None = None,
    check: Range | None = None,
    kw_only: bool = False,
    resumable: bool | None = None,
    role: str | None = None,
) -> Any:
    """Bind a dataclass attribute to the config key ``key`` (dotted: "trainer.max_steps"; the slash form "trainer/max_steps" is accepted too).

    Without a default the field is required (``???`` in the schema) and keyword-only.
    ``choices`` restricts the legal values; ``check``, a number's range (``POSITIVE``,
    ``Range(ge=0, lt=1)``), enforced where the class is built (``check_ranges``). ``kw_only`` suits a base class's fields, so that
    subclasses may still declare positional ones. ``resumable``: the key may change when a run
    resumes, as it leaves the numbers alone (None: the declaring class's ``RESUMABLE``, False
    unless it sets one). ``role``: ``SEED``, ``PLANNING`` or ``RUNTIME`` (``keys_with`` finds them;
    one declaration of a shared key gives it for all). Works on Flax modules and plain dataclasses.
    """
    parts = key.replace(".", "/").split("/")
    if not all(part.isidentifier() for part in parts):
        raise ValueError(f"config key {key!r} must be identifiers joined by '.' (e.g. \"architecture.d_model\")")
    if role not in (None, *ROLES):
        raise ValueError(f"{key}: role={role!r} is not one of {', '.join(ROLES)} (or None)")
    metadata = {_META: {"key": ".".join(parts), "help": help, "choices": tuple(choices) if choices else None,
                        "resumable": resumable, "check": check, "role": role}}
    if default is MISSING:
        return dataclasses.field(kw_only=True, metadata=metadata)
    if isinstance(default, list | dict | set):
        return dataclasses.field(default_factory=lambda: type(default)(default), kw_only=kw_only, metadata=metadata)
    return dataclasses.field(default=default, kw_only=kw_only, metadata=metadata)


@functools.cache
def specs(cls: type) -> tuple[FieldSpec, ...]:
    """The config fields of a dataclass (a Flax module, a settings class), in declaration order."""
    if not dataclasses.is_dataclass(cls):
        return ()
    hints = _type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META)
        if meta is None:
            continue
        default = f.default
        if default is MISSING and f.default_factory is not MISSING:
            default = f.default_factory()
        owner = _owner(cls, f.name)
        resumable = meta["resumable"] if meta["resumable"] is not None else getattr(owner, "RESUMABLE", False)
        out.append(
            FieldSpec(
                key=meta["key"],
                name=f.name,
                type=hints.get(f.name, f.type),
                default=default,
                help=meta["help"],
                choices=meta["choices"],
                owner=owner,
                resumable=bool(resumable),
                check=meta["check"],
                role=meta["role"],
            )
        )
    return tuple(out)


def components(cls: type) -> list[type]:
    """The configurable child types ``cls`` constructs (``[]`` when it declares none)."""
    method = getattr(cls, "components", None)
    return list(method()) if callable(method) else []


def gather(*roots: type) -> list[type]:
    """Every type in the components() trees of ``roots``, once each, depth-first pre-order."""
    seen: dict[type, None] = {}

    def visit(cls: type) -> None:
        if cls in seen:
            return
        seen[cls] = None
        for child in components(cls):
            visit(child)

    for root in roots:
        visit(root)
    return list(seen)


class Configurable:
    """Mixin for classes that construct configurable children: components() and gather(); a
    subclass's fields are checked against their declared ranges when it is built."""

    def __post_init__(self):
        check_ranges(self)

    @classmethod
    def components(cls) -> list[type]:
        """Configurable child types this class constructs; ``[]`` for a leaf."""
        return []

    @classmethod
    def gather(cls) -> list[type]:
        """``cls`` and every type in its components() tree, once each, in a stable order."""
        return gather(cls)


def type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an unresolvable annotation elsewhere in a Flax class: use raw ones
        return {}


def _owner(cls: type, name: str) -> type:
    """The most derived class in ``cls``'s MRO whose own body annotates ``name``."""
    for klass in cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            return klass
    return cls
