"""Whether this Python has theseus's dependencies. A Python without them (the system's, when the
virtual environment is not active) is told so in one line, not by a ModuleNotFoundError's
traceback from deep inside a command's first imports. ``import theseus`` asks before anything
else; asking finds the modules without importing them (well under a millisecond)."""

from __future__ import annotations

import importlib.util
import sys

# what every command imports as it starts, by module name: the distribution that installs it
CORE = {"numpy": "numpy", "jax": "jax", "flax": "flax", "optax": "optax", "omegaconf": "omegaconf",
        "hydra": "hydra-core"}


def missing(modules: dict[str, str] = CORE) -> list[str]:
    """The distributions of ``modules`` (module name -> distribution) this Python cannot import."""
    return [dist for module, dist in modules.items() if importlib.util.find_spec(module) is None]


def require_dependencies() -> None:
    """Exit 2 with one line naming what is missing and how to get it, when this Python lacks any of ``CORE``."""
    absent = missing()
    if absent:
        print(f"theseus: error: this Python ({sys.executable}) lacks theseus's dependencies ({', '.join(absent)}): "
              f"activate the virtual environment they are installed in (source .venv/bin/activate), or install "
              f"them there (pip install -e .)", file=sys.stderr)
        raise SystemExit(2)
