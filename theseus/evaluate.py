"""``python -m theseus.evaluate PATH [--step N] [--out FILE] [KEY=VALUE ...]``: the command is
``theseus.cli.evaluate``.
"""

from theseus.cli.command_exit import exit_after
from theseus.cli.evaluate import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_after(main)
