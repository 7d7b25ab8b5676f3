"""tests/accelerator/ runs only where a TPU or an NVIDIA GPU is attached, in one process
(``python -m pytest tests/accelerator -p no:xdist``): one program at a time can hold a TPU.
Elsewhere (CI) every test here is skipped, saying why. This process stays on the CPU, so the
commands the tests start in turn can each take the chip."""

from __future__ import annotations

import jax
import pytest

from theseus.base.platforms import attached_accelerator

jax.config.update("jax_platforms", "cpu")  # set before any backend starts: the chip is the commands'


def pytest_collection_modifyitems(items):
    if attached_accelerator() is None:
        skip = pytest.mark.skip(reason="no TPU or NVIDIA GPU attached: tests/accelerator runs on one")
        for item in items:
            if "accelerator" in item.path.parts:
                item.add_marker(skip)
