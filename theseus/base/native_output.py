"""Lines that native libraries print past Python, dropped from the console.

C++ libraries write to file descriptor 1 directly: gloo, the CPU collectives of a multi-process
run, prints ``[Gloo] Rank 0 is connected to 1 peer ranks. ...`` for each communicator it builds.
``drop_native_lines`` points descriptor 1 at a pipe whose reader forwards every other line to
the real output, while ``sys.stdout`` writes to the real output itself (a terminal stays a
terminal for the live progress bar).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable

def drop_native_lines(noise: Callable[[bytes], bool]) -> None:
    """From now on, drop each line written to descriptor 1 natively for which ``noise(line)``."""
    sys.stdout.flush()
    real = os.dup(1)
    read, write = os.pipe()
    os.dup2(write, 1)
    os.close(write)
    sys.stdout = open(real, "w", buffering=1, encoding=sys.stdout.encoding, errors=sys.stdout.errors, closefd=False)

    def forward() -> None:
        with open(read, "rb") as pipe:
            for line in iter(pipe.readline, b""):
                if not noise(line):
                    os.write(real, line)

    reader = threading.Thread(target=forward, name="native-output", daemon=True)
    reader.start()

    def restore() -> None:  # the pipe's last lines reach the output before the process ends
        os.dup2(real, 1)  # closes the pipe's write end: the reader drains it and stops
        reader.join(timeout=2)

    atexit.register(restore)


def is_gloo_noise(line: bytes) -> bool:
    """True for gloo's ``[Gloo] Rank R is connected to N peer ranks ...`` line."""
    return line.startswith(b"[Gloo] Rank ") and b" is connected to " in line
