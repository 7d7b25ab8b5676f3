"""Every dependency pyproject.toml declares is used: imported by the package, or a Hydra
plugin the shipped configs or README choose, or a pin whose reason is written here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

import pytest
from support import ROOT

from theseus.base.dependencies import CORE

IMPORTS = {"hydra-core": "hydra", "orbax-checkpoint": "orbax", "jaxlib": "jax", "tensorboardx": "tensorboardX",
           "pyyaml": "yaml", "hydra-submitit-launcher": "hydra_plugins.hydra_submitit_launcher"}  # jaxlib: jax's backend
PLUGINS = {"hydra-optuna-sweeper": "override /hydra/sweeper: optuna", "hydra-joblib-launcher": "hydra/launcher=joblib"}
PINS = {"sqlalchemy", "alembic"}  # optuna 2.10's SQLite storage (tests/e2e/test_optuna_storage.py)


def declared() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [re.split(r"[<>=!\[; ]", spec)[0].lower() for spec in project["dependencies"]]


def test_no_declared_dependency_goes_unused():
    code = "\n".join(p.read_text() for folder in ("theseus", "hydra_plugins") for p in (ROOT / folder).rglob("*.py"))
    shipped = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "sweeps").glob("*.yaml")])
    unused = []
    for name in declared():
        if name in PINS:
            continue
        if name in PLUGINS:
            used = PLUGINS[name] in shipped
        else:
            module = IMPORTS.get(name, name.replace("-", "_"))
            used = re.search(rf"^\s*(import|from) {module}\b", code, re.MULTILINE) is not None
        if not used:
            unused.append(name)
    assert not unused, f"declared in pyproject.toml, used nowhere: {unused}"
    assert "grain" not in declared() and "scikit-learn" not in declared()  # an extra: pip install 'theseus[pmm]'


def test_the_dependencies_import_theseus_asks_for_are_declared():
    assert set(CORE.values()) <= set(declared())
    assert all(IMPORTS.get(dist, dist.replace("-", "_")) == module for module, dist in CORE.items())


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["-m", "theseus.run", "+experiment=gpt_tiny"], ["-c", "import theseus"]])
def test_a_python_without_the_dependencies_says_so_in_one_line(tmp_path, argv):
    """The README's commands run by a Python whose environment is not active: this one without its
    site-packages (``-S``), theseus on its path. One line naming what is missing and the fix, exit 2."""
    proc = subprocess.run([sys.executable, "-S", *argv], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"theseus: error: this Python ({sys.executable}) lacks theseus's dependencies (numpy, jax, "
                           f"flax, optax, omegaconf, hydra-core): activate the virtual environment they are installed "
                           f"in (source .venv/bin/activate), or install them there (pip install -e .)\n")
    assert list(tmp_path.iterdir()) == []
