"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import ROOT, SHARED, run_python  # noqa: F401  (re-exported for tests)


@pytest.fixture
def shakespeare() -> Path:
    path = SHARED / "data" / "tinyshakespeare.txt"
    if not path.exists():
        pytest.skip("../shared/data/tinyshakespeare.txt is not beside this checkout")
    return path
