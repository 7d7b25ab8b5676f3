"""Lines that native libraries print past Python, dropped from the console.

C++ libraries write to file descriptors 1 and 2 directly: gloo, the CPU collectives of a
multi-process run, prints ``[Gloo] Rank 0 is connected to 1 peer ranks. ...`` for each
communicator it builds. ``drop_native_lines`` points descriptor 1 at a pipe whose reader
forwards every other line to the real output, while ``sys.stdout`` writes to the real output
itself (a terminal stays a terminal for the live progress bar); ``native_lines_filtered`` does
the same for a block (a subprocess a library starts, ``git`` run outside a repository).

JAX's CUDA plugin (the ``plan`` extra, which compiles for GPUs this machine lacks) loads its
libraries on ``import jax`` and again when JAX's backends start, and each load on a machine
without an NVIDIA driver tells descriptor 2 ``Could not find cuda drivers on your machine, GPU
will not be used.`` after absl's preamble. ``quiet_cuda_plugin`` drops those lines, and only
those, while the plugin's modules load and while it registers with JAX: each load runs with
descriptor 2 sent to a file, whose other lines are written out after it, in order.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TextIO

ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
NO_CUDA_DRIVER = re.compile(rb"[IWE]\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine")
CUDA_PLUGIN = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")
# libtpu, making a TPU topology off a TPU VM, says it cannot tell the VM's accelerator and workers
NO_TPU_VM = re.compile(rb"Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type"
                       rb"|WARNING: Logging before InitGoogle\(\) is written to STDERR"
                       rb"|E\d{4} [\d:.]+ +\d+ common_lib\.cc:\d+\] INVALID_ARGUMENT: Error: unexpected worker hostname "
                       rb"'WARNING: could not determine TPU worker hostnames"
                       rb"|=== Source Location Trace: ===\s*$|learning/\S+/libtpu_init_utils\.cc:\d+\s*$")
NVIDIA_DRIVER = "/proc/driver/nvidia"  # present where the driver is loaded: the plugin then has nothing to say

def _filtered(fd: int, noise: Callable[[bytes], bool]) -> tuple[int, Callable[[], None]]:
    """Point descriptor ``fd`` at a pipe whose reader forwards each line but noise to where ``fd``
    pointed; returns a descriptor of that place (for Python's own writes) and what restores ``fd``."""
    real = os.dup(fd)
    read, write = os.pipe()
    os.dup2(write, fd)
    os.close(write)

    def forward() -> None:
        with open(read, "rb") as pipe:
            for line in iter(pipe.readline, b""):
                if not noise(line):
                    os.write(real, line)

    reader = threading.Thread(target=forward, name="native-output", daemon=True)
    reader.start()

    def restore() -> None:  # the pipe's last lines reach the output first
        os.dup2(real, fd)  # closes the pipe's write end: the reader drains it and stops
        reader.join(timeout=2)

    return real, restore


def _direct(stream: TextIO, fd: int) -> TextIO:
    """A text stream like ``stream`` writing to descriptor ``fd`` (not closing it)."""
    return open(fd, "w", buffering=1, encoding=stream.encoding, errors=stream.errors, closefd=False)


def drop_native_lines(noise: Callable[[bytes], bool]) -> None:
    """From now on, drop each line written to descriptor 1 natively for which ``noise(line)``."""
    sys.stdout.flush()
    real, restore = _filtered(1, noise)
    sys.stdout = _direct(sys.stdout, real)
    atexit.register(restore)


@contextlib.contextmanager
def native_lines_filtered(noise: Callable[[bytes], bool]) -> Iterator[None]:
    """Within the block, drop each line written to descriptor 2 natively (a C library, a
    subprocess) for which ``noise(line)``; the others pass as they come. ``sys.stderr`` writes to
    the real output meanwhile (a terminal stays one for progress bars)."""
    sys.stderr.flush()
    real, restore = _filtered(2, noise)
    saved = sys.stderr
    sys.stderr = direct = _direct(saved, real)
    try:
        yield
    finally:
        sys.stderr = saved
        direct.close()  # flushed; the descriptor stays open
        restore()
        os.close(real)


GLOO_WORDS = frozenset(b"[Gloo] Rank R is connected to N peer ranks. Expected number of connected peer ranks is : N".split())
GLOO_TOKEN = re.compile(rb"\[Gloo\]|\d+|[^\s\d\[]+|\S")  # "7Expected" is "7", "Expected"


def is_gloo_noise(line: bytes) -> bool:
    """True for gloo's ``[Gloo] Rank R is connected to N peer ranks. Expected number of
    connected peer ranks is : N`` line, and for such lines of several threads run together
    (each writes its line in pieces, a piece may start right after another's number, or a
    number right after another's word, or a number left alone on a line): every word one of theirs."""
    words = GLOO_TOKEN.findall(line)
    return bool(words) and all(word in GLOO_WORDS or word.isdigit() for word in words)


def is_cuda_driver_noise(line: bytes) -> bool:
    """True for the CUDA plugin's ``cudart_stub.cc:31] Could not find cuda drivers ...`` line
    and the absl preamble before it."""
    return line.rstrip(b"\r\n") == ABSL_PREAMBLE or NO_CUDA_DRIVER.match(line) is not None


def is_off_tpu_vm_noise(line: bytes) -> bool:
    """True for the lines libtpu prints making a topology on a machine that is no TPU VM (the
    accelerator type and worker hostnames it could not find, and the trace of that error)."""
    return NO_TPU_VM.match(line) is not None


@contextlib.contextmanager
def native_lines_dropped(noise: Callable[[bytes], bool], fd: int = 2) -> Iterator[None]:
    """Within the block, drop each line written to descriptor ``fd`` (natively or by Python)
    for which ``noise(line)``; the others are written to it when the block ends, in order."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    real = os.dup(fd)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), fd)
        try:
            yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os.dup2(real, fd)
            os.close(real)
            captured.seek(0)
            kept = b"".join(line for line in captured.read().splitlines(keepends=True) if not noise(line))
            if kept:
                os.write(fd, kept)


class _QuietLoader(importlib.abc.Loader):
    """A CUDA plugin module's own loader, its loads run with the driver lines dropped."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def __getattr__(self, name: str):  # is_package, get_resource_reader, ...: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        with native_lines_dropped(is_cuda_driver_noise):
            return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with native_lines_dropped(is_cuda_driver_noise):
            self.loader.exec_module(module)
        initialize = getattr(module, "initialize", None)
        if module.__name__.startswith("jax_plugins.") and callable(initialize):  # JAX calls it to register the plugin
            @functools.wraps(initialize)
            def quiet_initialize(*args, **kwargs):
                with native_lines_dropped(is_cuda_driver_noise):
                    return initialize(*args, **kwargs)

            module.initialize = quiet_initialize


class _QuietCudaPlugin(importlib.abc.MetaPathFinder):
    """Finds the CUDA plugin's modules where Python would, and gives them a ``_QuietLoader``."""

    def find_spec(self, name: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith(CUDA_PLUGIN):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def quiet_cuda_plugin() -> None:
    """On a machine without an NVIDIA driver, drop the CUDA plugin's driver lines from now on
    (modules it has loaded already have spoken); elsewhere, and a second time, do nothing."""
    if not os.path.isdir(NVIDIA_DRIVER) and not any(isinstance(f, _QuietCudaPlugin) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietCudaPlugin())
