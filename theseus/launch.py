"""``python -m theseus.launch --processes N -- ARGS``: the command is ``theseus.cli.launch``."""

from theseus.cli.command_exit import exit_after
from theseus.cli.launch import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_after(main)
