"""A command ended by ``exit_after`` keeps its status and every exit handler's work (JAX's, the
command's own, its buffered output) and skips the interpreter's teardown, where C++ threads
stopped mid-call abort a finished run now and then."""

from __future__ import annotations

import pytest

from support import run_python

COMMAND = """
import atexit, sys
import jax  # its exit handlers (pending effects, the distributed client) are registered on import
import theseus
from theseus.cli.command_exit import exit_after

class Global:
    def __del__(self):
        print("torn down", flush=True)

kept = Global()  # __main__'s globals are destroyed in the interpreter's teardown

def main():
    atexit.register(print, "handler ran")
    jax.debug.print("effect {x}", x=jax.numpy.int32(7))  # JAX's handler waits for it
    print("buffered", end=" ")  # block-buffered: stdout is a pipe
    if sys.argv[1] == "exit":
        sys.exit(sys.argv[2])
    return int(sys.argv[2])

if sys.argv[1] == "plain":
    sys.exit(main())
exit_after(main)
"""


@pytest.mark.parametrize(("how", "given", "status"), [("return", "0", 0), ("return", "3", 3), ("exit", "no such run", 1)])
def test_the_status_and_every_handlers_output_remain_and_the_teardown_is_skipped(how, given, status):
    proc = run_python("-c", COMMAND, how, given)
    assert proc.returncode == status, proc.stderr
    assert "buffered handler ran" in proc.stdout and "effect 7" in proc.stdout
    assert "torn down" not in proc.stdout
    assert (given in proc.stderr.splitlines()) == (how == "exit")  # sys.exit's message, printed as Python prints it


def test_the_teardown_the_test_looks_for_happens_without_it():
    proc = run_python("-c", COMMAND, "plain", "0")
    assert proc.returncode == 0, proc.stderr
    assert "torn down" in proc.stdout
