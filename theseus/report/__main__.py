"""``python -m theseus.report PATH [PATH ...] [--serve]``: the command is ``theseus.cli.report``."""

from theseus.cli.command_exit import exit_after
from theseus.cli.report import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_after(main)
