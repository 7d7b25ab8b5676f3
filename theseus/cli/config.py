"""``python -m theseus.config [OVERRIDES]``: every derived key with type, default and help.

With overrides, prints the composed config instead (or the one-line error it gives).
"""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

from theseus.config.compose import compose
from theseus.config.errors import ConfigError
from theseus.config.listing import choices, listing


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        print(__doc__.strip())
        return 0
    try:
        print(OmegaConf.to_yaml(compose(argv)) if argv else f"{listing()}\n\nchoices:\n{choices()}", end="")
    except ConfigError as exc:  # a user module that does not import, too
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    return 0
