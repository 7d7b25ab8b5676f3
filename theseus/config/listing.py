"""A listing of every derived key: what ``python -m theseus.config`` and ``--help`` print."""

from __future__ import annotations

from theseus.config import registry
from theseus.config.fields import type_name
from theseus.config.schema import schema_of


def listing() -> str:
    """Every option of every group with the keys it declares (type, default, declaring class, help)."""
    registry.load()
    lines = []
    for group in registry.groups():
        for name, cls in registry.options(group).items():
            lines.append(f"{group}={name}  ({cls.__module__}.{cls.__qualname__})")
            for key, spec in schema_of(cls).items():
                default = "???" if spec.required else repr(spec.default)
                lines.append(f"  {key:<30} {type_name(spec.type):<12} {default:<12} "
                             f"[{spec.owner.__name__}] {spec.help}")
    return "\n".join(lines)


def choices() -> str:
    """One line per group: its options, then the experiment and sweep files."""
    registry.load()
    lines = [f"  {group}: {', '.join(registry.names(group))}" for group in registry.groups()]
    for group, folder in registry.FOLDERS.items():
        names = ", ".join(registry.folder_options(group)) or "(none)"
        lines.append(f"  +{group}: {names}  ({folder}/)")
    return "\n".join(lines)
