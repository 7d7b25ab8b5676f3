"""A theseus command on a CPU host starts again, once, with huge pages for glibc's malloc; a
user's own Python process does not; the tunable does what it is for (XLA's large, short-lived
allocations mapped in 2 MiB pages)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from theseus.base.host_allocator import (TUNABLE, glibc_version, huge_pages_wanted, started_as_command,
                                         with_huge_pages)

CPU = {**os.environ, "JAX_PLATFORMS": "cpu"}
CPU.pop("GLIBC_TUNABLES", None)
needs_huge_pages = pytest.mark.skipif(not huge_pages_wanted(CPU), reason="no glibc >= 2.35, or the kernel's "
                                      "transparent huge pages are not given on request (madvise)")


@pytest.mark.parametrize(("argv", "command"), [
    (["python", "-m", "theseus.run", "+experiment=gpt_tiny"], True),
    (["python", "-u", "-X", "importtime", "-m", "theseus.sample", "folder"], True),
    (["python", "-mtheseus"], True),
    (["/venv/bin/python3", "/venv/bin/theseus", "--help"], True),
    (["python", "-m", "pytest", "-m", "theseus"], False),
    (["python", "-c", "import theseus"], False),
    (["python", "train.py", "-m", "theseus.run"], False),
    (["python"], False),
])
def test_a_command_is_told_from_a_users_process(argv, command):
    assert started_as_command(argv) is command


def test_the_tunable_joins_the_users_own():
    env = with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/h"})
    assert env == {"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{TUNABLE}=1", "HOME": "/h"}
    assert with_huge_pages({})["GLIBC_TUNABLES"] == f"{TUNABLE}=1"


@pytest.mark.skipif(glibc_version() is None or glibc_version() < (2, 35), reason="glibc >= 2.35 only")
@pytest.mark.parametrize(("mode", "environ", "wanted"), [
    ("always [madvise] never\n", {"JAX_PLATFORMS": "cpu"}, True),
    ("[always] madvise never\n", {"JAX_PLATFORMS": "cpu"}, False),  # every mapping has them already
    ("always madvise [never]\n", {"JAX_PLATFORMS": "cpu"}, False),
    ("always [madvise] never\n", {}, False),  # an accelerator's host: its scratch memory is the device's
    ("always [madvise] never\n", {"JAX_PLATFORMS": "cpu", "GLIBC_TUNABLES": f"{TUNABLE}=0"}, False),
    (None, {"JAX_PLATFORMS": "cpu"}, False),  # no such file: not Linux, or no THP
])
def test_huge_pages_are_wanted_where_they_help(tmp_path, mode, environ, wanted):
    thp = tmp_path / "enabled"
    if mode is not None:
        thp.write_text(mode)
    assert huge_pages_wanted(environ, thp) is wanted


SITE = """
import os, sys
with open(os.environ["STARTS"], "a") as f:
    f.write(f"{os.getpid()} {os.environ.get('GLIBC_TUNABLES')}\\n")
"""


def starts(tmp_path: Path, *argv: str, **env: str) -> list[tuple[str, str]]:
    """Each Python process start ``argv`` made (its pid, its GLIBC_TUNABLES), as a sitecustomize saw them."""
    (tmp_path / "site").mkdir(exist_ok=True)
    (tmp_path / "site" / "sitecustomize.py").write_text(SITE)
    log = tmp_path / "starts.txt"
    log.unlink(missing_ok=True)
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**CPU, "PYTHONPATH": str(tmp_path / "site"), "STARTS": str(log), **env})
    assert proc.returncode == 0, proc.stderr
    return [tuple(line.split(" ", 1)) for line in log.read_text().splitlines()]


@needs_huge_pages
def test_a_command_starts_again_once_with_huge_pages(tmp_path):
    (first, before), (again, after) = starts(tmp_path, sys.executable, "-m", "theseus.run", "--help")
    assert first == again and before == "None" and after == f"{TUNABLE}=1"  # the same process, exec'd
    assert len(starts(tmp_path, str(Path(sys.executable).with_name("theseus")), "--help")) == 2


@needs_huge_pages
def test_a_users_process_and_a_users_choice_are_left_alone(tmp_path):
    assert [tunables for _, tunables in starts(tmp_path, sys.executable, "-c", "import theseus")] == ["None"]
    kept = starts(tmp_path, sys.executable, "-m", "theseus.run", "--help", GLIBC_TUNABLES=f"{TUNABLE}=0")
    assert [tunables for _, tunables in kept] == [f"{TUNABLE}=0"]


LARGE = """
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
block = libc.malloc(64 << 20)  # 64 MiB with malloc, as XLA allocates its scratch memory (numpy asks for huge pages itself)
ctypes.memset(block, 1, 64 << 20)
print(sum(int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages")))
"""


@needs_huge_pages
def test_the_tunable_maps_a_large_allocation_in_huge_pages():
    def huge_kib(env: dict[str, str]) -> int:
        proc = subprocess.run([sys.executable, "-c", LARGE], capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout)

    assert huge_kib(with_huge_pages(CPU)) - huge_kib(CPU) >= 32 << 10
