"""Shared test fixtures."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

# The tests compile at LLVM -O1, this process and the subprocesses it starts (set before JAX is
# imported). Most of the suite's time is XLA compiling small programs once; -O1 takes ~15% less
# of it and gives the same values (LLVM's level changes no HLO:
# not the fusions, buffers, FLOPs or memory that tests check). The product compiles at XLA's
# default; tests/training/test_state.py compares its -O1 init with that default explicitly.
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=1".strip()
# A subprocess that crashes (a segfault in native code) prints its threads' Python stacks.
os.environ["PYTHONFAULTHANDLER"] = "1"

from support import ROOT, SHARED, TEXT, run_python  # noqa: F401  (re-exported for tests)

import jax  # noqa: E402

# In this process, one CPU device whichever test starts the backend first (a run's automatic
# count would otherwise depend on the order); the subprocesses the tests start choose their own.
jax.config.update("jax_num_cpu_devices", 1)


@pytest.fixture
def shakespeare() -> Path:
    path = SHARED / "data" / "tinyshakespeare.txt"
    if not path.exists():
        pytest.skip("../shared/data/tinyshakespeare.txt is not beside this checkout")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small text corpus (this Python's json module source, three times) for short real runs."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(TEXT.read_text() * 3)
    return path


def pytest_collection_modifyitems(items):
    """Marks every test under tests/e2e/ `e2e`, so `-m e2e` (or `-m "not e2e"`) selects by folder;
    orders the files by their count of `slow` tests, most first (each file's tests kept together,
    in order), so that `-n 2`'s workers start the long ones early and finish together."""
    e2e = Path(__file__).parent / "e2e"
    for item in items:
        if e2e in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    collected = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-slow[item.path], collected[item.path]))
