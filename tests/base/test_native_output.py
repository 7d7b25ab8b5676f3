"""gloo's connection lines, written natively to descriptor 1, and the CUDA plugin's driver
lines, written to descriptor 2 as it loads on a machine without an NVIDIA driver, are dropped;
every other line, native or Python's, reaches the output."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import run_python
from theseus.base.native_output import NVIDIA_DRIVER, is_cuda_driver_noise, native_lines_dropped

SCRIPT = """
import os, sys
from theseus.base.native_output import drop_native_lines, is_gloo_noise
drop_native_lines(is_gloo_noise)
os.write(1, b"[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\\n")
os.write(1, b"7 peer ranks. [Gloo] Rank 3 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7\\n")
os.write(1, b"[Gloo] Rank 1 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7[Gloo] Rank 2 "
            b"is connected to [Gloo] Rank 3 is connected to \\n7 peer ranks. Expected number of connected peer ranks is : "
            b"77\\n peer ranks. Expected number of connected peer ranks is : 7\\n")  # three threads' pieces, as CI saw
os.write(1, b"[Gloo] Rank 3 is connected to 7 peer ranks. Expected number of connected peer ranks is : [Gloo] Rank 1 "
            b"is connected to 7 peer ranks. 7Expected number of connected peer ranks is : \\n7\\n")  # a number, then a word
os.write(1, b"[Gloo] an error gloo reports\\nnative line\\n")
print("python line")
"""


def test_gloo_connection_lines_are_dropped_and_the_rest_kept():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[Gloo] an error gloo reports", "native line", "python line"]


GIT = """
import os, subprocess, sys, time
from theseus.base.native_output import native_lines_filtered
with native_lines_filtered(lambda line: line.startswith(b"fatal: not a git repository")):
    print("python line first", file=sys.stderr, flush=True)
    subprocess.run(["git", "describe", "--always"], cwd=sys.argv[1], stdout=subprocess.DEVNULL)
    os.write(2, b"native line\\n")
    time.sleep(0.2)  # the reader has forwarded it: it passes as it comes, not at the end
    print("python line", file=sys.stderr, flush=True)
print("after", file=sys.stderr, flush=True)
subprocess.run(["git", "describe", "--always"], cwd=sys.argv[1], stdout=subprocess.DEVNULL)
"""


def test_a_blocks_native_noise_is_dropped_and_the_rest_passes_as_it_comes(tmp_path):
    """git outside a repository, run inside the block: its line dropped; after the block, not."""
    proc = subprocess.run([sys.executable, "-c", GIT, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[:4] == ["python line first", "native line", "python line", "after"], lines
    assert len(lines) == 5 and lines[4].startswith("fatal: not a git repository"), lines


NO_DRIVER = (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
             b"I0000 00:00:1796232931.714563    5524 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
             b"GPU will not be used.\n")
# a stand-in for the CUDA plugin's PJRT module, under its name: it speaks natively as it loads and registers
PLUGIN = f"""
import os
os.write(2, {NO_DRIVER!r} + b"loading\\n")

def initialize():
    os.write(2, {NO_DRIVER!r} + b"registering\\n")
    return "registered"
"""
driver = pytest.mark.skipif(Path(NVIDIA_DRIVER).is_dir(), reason="an NVIDIA driver here: the plugin is left alone")


def test_cuda_driver_lines_within_a_block_are_dropped_and_the_rest_written_after_it(capfd):
    with native_lines_dropped(is_cuda_driver_noise):
        os.write(2, NO_DRIVER + b"native line\n")
        os.write(2, b"I0000 00:00:1.5  7 other.cc:3] another library's line\n" + NO_DRIVER)
    assert capfd.readouterr().err.splitlines() == ["native line", "I0000 00:00:1.5  7 other.cc:3] another library's line"]


@driver
def test_the_cuda_plugin_loads_and_registers_without_its_driver_lines_once_theseus_is_imported(tmp_path):
    (tmp_path / "jax_plugins" / "xla_cuda12").mkdir(parents=True)
    (tmp_path / "jax_plugins" / "xla_cuda12" / "__init__.py").write_text(PLUGIN)
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import theseus, importlib; "
              "print(importlib.import_module('jax_plugins.xla_cuda12').initialize())")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout, proc.stderr) == ("registered\n", "loading\nregistering\n")


@driver
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is None, reason="the plan extra's CUDA plugin")
def test_with_the_cuda_plugin_installed_a_mistake_is_still_one_line(tmp_path):
    proc = run_python("-m", "theseus.run", "+experiment=gpt_tiny", "trainer.bogus=1", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stderr.startswith("theseus: error: unknown")
