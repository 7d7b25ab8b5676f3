"""Huge pages for the host allocator under XLA's CPU runtime.

XLA's CPU runtime allocates a compiled program's scratch memory (its temp buffer: 980 MB a
device for a SmolLM2-135M LoRA step, batch 4 x 256) with ``malloc`` at every execution and
frees it after. glibc maps an allocation that large afresh and unmaps it on ``free``, so every
step faults its whole scratch memory in again, 4 KiB at a time: 500k page faults and 0.7 s of
kernel time a step there, a tenth of its CPU time. With glibc's ``glibc.malloc.hugetlb=1``
tunable, ``malloc`` asks for transparent huge pages on those mappings (``madvise``): 2 MiB a
fault, 2-7k faults a step, the same peak memory.

A tunable is read as a process starts, so a theseus command (``python -m theseus...``, the
``theseus`` script) started on a CPU host without it starts again with it, ``os.execve`` of the
same command line, before anything but ``import theseus`` has run (Python starts twice: ``--help``
1.45 -> 1.50 s). Not where the kernel's transparent huge pages are off, or on for every mapping
already (``/sys/kernel/mm/transparent_hugepage/enabled``), off glibc (or before 2.35, which lacks
the tunable), nor where ``GLIBC_TUNABLES`` sets it already: ``GLIBC_TUNABLES=glibc.malloc.hugetlb=0``
keeps 4 KiB pages. A Python process of the user's own (a notebook calling ``theseus.train``)
gets them with that variable set to 1 before Python starts.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb"
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")  # "always [madvise] never": the bracketed one is on


def glibc_version() -> tuple[int, int] | None:
    """This process's glibc version; None under another C library (musl, macOS's)."""
    try:
        version = ctypes.CDLL(None).gnu_get_libc_version
    except (OSError, AttributeError):
        return None
    version.restype = ctypes.c_char_p
    major, minor = version().decode().split(".")[:2]
    return int(major), int(minor)


def huge_pages_wanted(environ: Mapping[str, str] = os.environ, thp: Path = THP) -> bool:
    """Whether ``malloc`` should ask for huge pages here: a CPU-only process (``JAX_PLATFORMS=cpu``)
    under glibc >= 2.35, the kernel's huge pages given on request (``madvise``), the tunable unset."""
    try:
        mode = thp.read_text()
    except OSError:
        return False
    return (environ.get("JAX_PLATFORMS") == "cpu" and "[madvise]" in mode and TUNABLE not in
            environ.get("GLIBC_TUNABLES", "") and (glibc_version() or (0, 0)) >= (2, 35))


def with_huge_pages(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the tunable added to ``GLIBC_TUNABLES`` (for a process about to start)."""
    tunables = ":".join(filter(None, [environ.get("GLIBC_TUNABLES", ""), f"{TUNABLE}=1"]))
    return {**environ, "GLIBC_TUNABLES": tunables}


def started_as_command(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (``sys.orig_argv``) started a theseus command: ``python [options] -m
    theseus...``, or the ``theseus`` script."""
    if len(argv) > 1 and Path(argv[1]).name == "theseus":
        return True
    args = iter(argv[1:])
    for arg in args:
        if arg.startswith("-m"):
            return (arg[2:] or next(args, "")).partition(".")[0] == "theseus"
        if arg in ("-X", "-W"):  # options with a value of their own
            next(args, None)
        elif not arg.startswith("-") or arg.startswith("-c"):
            return False
    return False


def restart_with_huge_pages() -> None:
    """Start this theseus command again with huge pages for ``malloc``, where they are wanted
    and it is a command (see the module's docstring); else return."""
    if started_as_command(sys.orig_argv) and huge_pages_wanted():
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, with_huge_pages(os.environ))
