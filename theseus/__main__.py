"""``theseus COMMAND [ARGS]`` (or ``python -m theseus COMMAND``): one command for every entry point.

    theseus run +experiment=gpt_tiny        python -m theseus.run ...
    theseus sample RUN_DIR                  python -m theseus.sample ...
    theseus report PATH                     python -m theseus.report ...
    theseus config [OVERRIDES]              python -m theseus.config ...
    theseus prepare [data.* OVERRIDES]      python -m theseus.data.prepare ...
    theseus launch --processes 2 -- ARGS    python -m theseus.launch ...
    theseus export RUN_DIR OUT_DIR          python -m theseus.export ...
    theseus evaluate RUN_DIR                python -m theseus.evaluate ...

Hydra's shell completion works for ``theseus run``: ``eval "$(theseus -sc install=bash)"``.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from typing import NoReturn

from theseus.cli.command_exit import exit_after
from theseus.config.arguments import plain

COMMANDS = {
    "run": "theseus.cli.run",
    "sample": "theseus.cli.sample",
    "report": "theseus.cli.report",
    "config": "theseus.cli.config",
    "prepare": "theseus.cli.prepare",
    "launch": "theseus.cli.launch",
    "export": "theseus.cli.export",
    "evaluate": "theseus.cli.evaluate",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-sc", "--shell-completion"):  # Hydra's completion script calls `theseus -sc ...`
        program, _, rest = os.environ.get("COMP_LINE", "").partition(" ")
        if rest.split(" ", 1)[0] == "run":  # `theseus run ARGS` completes as the run command's line
            os.environ["COMP_LINE"] = f"{program} {rest[3:].lstrip()}"
        argv = ["run", *argv]
    if not argv or argv[0] not in COMMANDS:
        print(plain(__doc__.strip()) if not argv or argv[0] in ("-h", "--help") else
              f"theseus: error: unknown command {argv[0]!r}{_did_you_mean(argv[0])}; commands: {', '.join(COMMANDS)}",
              file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    command, args = argv[0], argv[1:]
    sys.argv = ["theseus", *args]  # the program name Hydra's completion script installs under
    return importlib.import_module(COMMANDS[command]).main(args) or 0


def command() -> NoReturn:
    """The ``theseus`` script: ``main()``, the process ended as ``exit_after`` ends it."""
    exit_after(main)


SYNONYMS = {"train": "run", "fit": "run", "generate": "sample", "eval": "evaluate", "dashboard": "report"}


def _did_you_mean(word: str) -> str:
    """``; did you mean run?`` for a command's other name or a misspelling, else nothing."""
    close = SYNONYMS.get(word) or next(iter(difflib.get_close_matches(word, COMMANDS, n=1)), None)
    return f"; did you mean theseus {close}?" if close else ""


if __name__ == "__main__":
    command()
