"""``python -m theseus.config [OVERRIDES]``: every derived key with type, default and help.

With overrides, prints the composed config instead (or the one-line error it gives).
"""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

from theseus.config import registry
from theseus.config.compose import compose
from theseus.config.errors import ConfigError
from theseus.config.fields import type_name
from theseus.config.schema import schema_of


def listing() -> str:
    """A table of every option of every group and the keys it declares."""
    registry.load_builtins()
    lines = []
    for group in registry.GROUPS:
        for name, cls in registry.options(group).items():
            lines.append(f"{group}={name}  ({cls.__module__}.{cls.__qualname__})")
            for key, spec in schema_of(cls).items():
                default = "???" if spec.required else repr(spec.default)
                lines.append(f"  {key:<34} {type_name(spec.type):<14} {default:<14} {spec.help}")
    for group in registry.FOLDERS:
        names = ", ".join(registry.folder_options(group)) or "(none)"
        lines.append(f"+{group}=: {names}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print(listing())
        return 0
    try:
        print(OmegaConf.to_yaml(compose(argv)), end="")
    except ConfigError as exc:
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
