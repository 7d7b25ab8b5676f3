"""Every dependency pyproject.toml declares is used: imported by the package, or a Hydra
plugin the shipped configs or README choose, or a pin whose reason is written here."""

from __future__ import annotations

import re
import tomllib

from support import ROOT

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
