"""The commands a run prints for the user to run next (resume, continue)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def command_line(drop: tuple[str, ...] = (), add: Sequence[str] = ()) -> str:
    """This process's ``python -m theseus.run`` command line, less the arguments starting with
    one of ``drop`` (and any ``trainer.resume``), plus ``add``."""
    kept = [arg for arg in sys.argv[1:] if not arg.startswith((*drop, "trainer.resume="))]
    return " ".join(["python -m theseus.run", *kept, *add])


def resume_command() -> str:
    """The command line that continues this run: the same one, given ``hydra.run.dir``, or with
    ``trainer.resume=last`` (which finds the newest run it can continue)."""
    given = any(arg.startswith("hydra.run.dir=") for arg in sys.argv[1:])
    return command_line(add=[] if given else ["trainer.resume=last"])
