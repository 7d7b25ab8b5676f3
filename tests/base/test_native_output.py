"""gloo's connection lines, written natively to descriptor 1, are dropped; every other line,
native or Python's, reaches the output."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, sys
from theseus.base.native_output import drop_native_lines, is_gloo_noise
drop_native_lines(is_gloo_noise)
os.write(1, b"[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\\n")
os.write(1, b"[Gloo] an error gloo reports\\nnative line\\n")
print("python line")
"""


def test_gloo_connection_lines_are_dropped_and_the_rest_kept():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[Gloo] an error gloo reports", "native line", "python line"]
