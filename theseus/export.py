"""``python -m theseus.export SOURCE OUT_DIR [--step N] [--adapter]``: the command is
``theseus.cli.export``.
"""

from theseus.cli.command_exit import exit_after
from theseus.cli.export import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_after(main)
