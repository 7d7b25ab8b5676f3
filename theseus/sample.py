"""``python -m theseus.sample PATH [--prompt TEXT | --chat [MESSAGE]]``: the command is
``theseus.cli.sample``.
"""

from theseus.cli.command_exit import exit_after
from theseus.cli.sample import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_after(main)
