"""``python -m theseus.config [OVERRIDES]``: the command is ``theseus.cli.config``."""

from theseus.cli.command_exit import exit_after
from theseus.cli.config import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_after(main)
