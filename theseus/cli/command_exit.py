"""How a command's process ends: every exit handler runs, then the process exits at once.

Python's own ending tears the interpreter down after the ``atexit`` handlers: it destroys
modules and stops daemon threads while XLA's, tensorstore's and the CUDA plugin's C++ threads
may still call into it. Now and then one of them is stopped inside a C++ frame, and a run that
has finished and written everything aborts ("terminate called after throwing an instance of
''", "FATAL: exception not rethrown", SIGABRT): a scheduler then reports the job failed.
Nothing the teardown does is needed once the handlers (JAX's, the loggers', W&B's) have run.

``theseus/__init__.py`` imports this module before anything else, so that its handler,
registered first, runs last: after JAX's (pending effects, the distributed client's shutdown).
Importing it changes nothing else: the handler acts only in a process ``exit_after`` ends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Callable
from typing import NoReturn

_status: list[int] = []  # the command's exit status, once its main has returned


def exit_after(main: Callable[[], int | None]) -> NoReturn:
    """``sys.exit(main())``, the interpreter's teardown skipped: once the ``atexit`` handlers
    have run, the process exits with main's status, its streams flushed. An exception other
    than SystemExit ends the process as Python does (its traceback, status 1)."""
    try:
        status = main()
    except SystemExit as exc:
        status = exc.code
    _status.append(0 if status is None else status if isinstance(status, int) else 1)
    sys.exit(status)  # a message (a string status) is printed by Python, before the handlers


@atexit.register
def _exit_now() -> None:
    if _status:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
                stream.flush()
        os._exit(_status[0])
