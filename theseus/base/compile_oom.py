"""A step that runs out of device memory while it compiles, as a verdict instead of a traceback.

XLA refuses to compile a program larger than the device's memory, each backend in its own
words (the texts below are real ones)::

    libtpu 0.0.42   RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO
                    temporaries (80.01G) exceeds available HBM (15.75G).
    libtpu 0.0.52   RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total
                    memory required for HLO temporaries (80.01G) exceeds available HBM (15.75G). ...
    older libtpu    RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory
                    space hbm. Used 21.95G of 15.48G hbm. Exceeded hbm capacity by 6.47G. ...
    XLA GPU/CPU     RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4770354232 bytes.
                    BufferAssignment OOM Debugging. ... total allocation: 14.44GiB ...
    XLA CPU, run    RESOURCE_EXHAUSTED: Out of memory allocating 29613842628 bytes.

``out_of_memory(exc)`` reads what the step needs and what the device has from any of them (bytes;
G is GiB, as libtpu counts); ``oom_verdict`` turns such an exception, where a step is compiled,
into a ``ConfigError`` (``DoesNotFit``, with the sizes): ``does not fit: needs X, has Y`` and what
to change. Other errors pass.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

from theseus.config import ConfigError

_SIZE = r"(\d+(?:\.\d+)?)\s*([KMGTP]?)i?B?"
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
# each: the size needed, the size available (groups of two: number, unit) and the memory's name
_REQUIRED = re.compile(rf"memory required for [\w ]+? \({_SIZE}\) exceeds available (?P<memory>\w+) \({_SIZE}\)")
_USED = re.compile(rf"Ran out of memory in memory space (?P<memory>\w+)\. Used {_SIZE} of {_SIZE} ")
_ALLOCATE = re.compile(r"Out of memory (?:while trying to allocate|allocating) (?P<bytes>\d+) bytes")
_TOTAL = re.compile(rf"total allocation:\s*{_SIZE}")
ADVICE = ("lower trainer.batch_size or architecture.seq_len, raise trainer.grad_accum, set architecture.remat=full, "
          "or shard over more devices (mesh.fsdp, mesh.tensor)")


@dataclass(frozen=True)
class OutOfMemory:
    """What a step that did not compile needed and what the device had (bytes; None: not said)."""

    needed: int
    available: int | None
    memory: str  # the device memory the backend names: HBM, device memory

    def verdict(self, advice: str = ADVICE) -> str:
        has = f", has {_human(self.available)}" if self.available is not None else ""
        return f"does not fit: needs {_human(self.needed)} of {self.memory} per device{has}: {advice}"


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit.upper()])


def _human(n: int) -> str:
    """``15.75 GiB``: binary units, as the backends count."""
    unit = next((u for u in ("P", "T", "G", "M", "K") if n >= _UNITS[u]), "")
    return f"{n / _UNITS[unit]:.4g} {unit}iB" if unit else f"{n} B"


def out_of_memory(exc: BaseException) -> OutOfMemory | None:
    """The sizes of a compile-time out-of-memory error, from its text; None for any other error."""
    text = str(exc)
    if "RESOURCE_EXHAUSTED" not in text:
        return None
    if m := _REQUIRED.search(text):
        return OutOfMemory(_bytes(*m.group(1, 2)), _bytes(*m.group(4, 5)), m["memory"].upper())
    if m := _USED.search(text):
        return OutOfMemory(_bytes(*m.group(2, 3)), _bytes(*m.group(4, 5)), m["memory"].upper())
    if m := _ALLOCATE.search(text):
        total = _TOTAL.search(text)
        return OutOfMemory(_bytes(*total.groups()) if total else int(m["bytes"]), None, "device memory")
    return None


class DoesNotFit(ConfigError):
    """A step that ran out of device memory while it compiled: its verdict (``NAME does not fit:
    ...: ADVICE``), and the sizes (``oom``) for a plan's table."""

    def __init__(self, name: str, oom: OutOfMemory, advice: str = ADVICE):
        super().__init__(f"{name} {oom.verdict(advice)}")
        self.name, self.oom = name, oom

    def advised(self, advice: str) -> DoesNotFit:
        """The same verdict with another ``advice``."""
        return DoesNotFit(self.name, self.oom, advice)


@contextlib.contextmanager
def oom_verdict(name: str, available: int | None = None, advice: str = ADVICE) -> Iterator[None]:
    """Around a compile: an out-of-memory error becomes a ``DoesNotFit`` (a ConfigError) saying
    ``NAME does not fit: needs X, has Y: ADVICE`` (``available``: the device's bytes, where the
    backend does not say them); any other error passes unchanged."""
    try:
        yield
    except Exception as exc:
        oom = out_of_memory(exc)
        if oom is None:
            raise
        if oom.available is None and available is not None:
            oom = OutOfMemory(oom.needed, available, oom.memory)
        raise DoesNotFit(name, oom, advice) from None
