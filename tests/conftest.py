"""Shared test fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import ROOT, SHARED, run_python  # noqa: F401  (re-exported for tests)


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
    path.write_text(Path(json.__file__).read_text() * 3)
    return path
