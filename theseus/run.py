"""``python -m theseus.run +experiment=NAME [key=value ...]``: compose, check, train;
``train(overrides_or_cfg, run_dir)`` from Python. The command is ``theseus.cli.run``.
"""

from theseus.cli.command_exit import exit_after
from theseus.cli.run import main, train

__all__ = ["main", "train"]

if __name__ == "__main__":
    exit_after(main)
