"""The versions tested are the versions installed: ``constraints.txt`` pins every package the
README's test install brings (``pip install -c constraints.txt -e ".[test]"``, what CI runs) at
the version this environment holds; the accelerator packages are paired as JAX declares them
for its version; the main job's install (``pip install -c constraints.txt -e .``) is light.

After changing an install, regenerate the file: ``python tests/test_constraints.py > constraints.txt``.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import distribution, packages_distributions, version

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from support import ROOT, requirement_closure

CONSTRAINTS = ROOT / "constraints.txt"
HEADER = """\
# Every package the README's test install brings, at the version CI tested (both README install
# lines use it: pip install -c constraints.txt ...). Regenerate: python tests/test_constraints.py > constraints.txt
"""
HEAVY = {"torch", "libtpu", "jax-cuda12-plugin", "jax-cuda12-pjrt", "lm-eval", "transformers"}  # not to train a GPT


def requirements(extra: str | None) -> list[str]:
    """pyproject.toml's requirements: the main ones (``extra=None``) or an extra's, this
    project's own extras (``theseus[a,b]``) expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = []
    for line in project["dependencies"] if extra is None else project["optional-dependencies"][extra]:
        req = Requirement(line)
        out += [r for e in sorted(req.extras) for r in requirements(e)] if req.name == "theseus" else [line]
    return out


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock() -> str:
    """constraints.txt as this environment's test install makes it (local version labels, such as
    torch's ``+cpu``, dropped: the build is the index's choice, the version is pinned)."""
    dists = requirement_closure(requirements(None) + requirements("test"))
    pins = sorted(f"{normal(d.metadata['Name'])}=={d.version.split('+')[0]}" for d in dists)
    return HEADER + "\n".join(pins) + "\n"


def pins() -> dict[str, str]:
    lines = [line for line in CONSTRAINTS.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("==") for line in lines)


def test_the_constraints_pin_every_package_of_the_test_install_at_the_version_installed():
    assert CONSTRAINTS.read_text() == lock(), "constraints.txt is stale: python tests/test_constraints.py > constraints.txt"


def test_the_accelerator_packages_are_paired_as_jax_declares_them():
    """jax's own ``tpu`` and ``cuda12-local`` extras name the libtpu and CUDA plugin of its version."""
    declared = {}
    for line in distribution("jax").requires:
        req = Requirement(line)
        if req.marker and (req.marker.evaluate({"extra": "tpu"}) or req.marker.evaluate({"extra": "cuda12-local"})):
            declared[normal(req.name)] = req.specifier
    pinned = pins()
    assert {"libtpu", "jax-cuda12-plugin", "jaxlib"} <= declared.keys()
    for name, specifier in declared.items():
        assert name in pinned and specifier.contains(pinned[name], prereleases=True), (name, pinned.get(name), specifier)
    assert pinned["jax-cuda12-pjrt"] == pinned["jax"] == version("jax")


def test_the_main_jobs_install_is_light():
    main = {normal(d.metadata["Name"]) for d in requirement_closure(requirements(None))}
    assert not HEAVY & main, f"the main job's install (pip install -e .) brings {sorted(HEAVY & main)}"
    assert {"jax", "flax", "optax"} <= main and SpecifierSet(">=0.7.1").contains(pins()["jax"])


def test_the_readmes_python_needs_the_main_install_or_says_what_to_install():
    """Every module a README ``python`` block imports is Python's own, theseus's, or one the main
    install (``pip install -e .``) brings; any other is imported on a line naming its ``pip install``."""
    main = {normal(d.metadata["Name"]) for d in requirement_closure(requirements(None))}
    owners = packages_distributions()
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.M | re.S)
    assert any("save_to_disk" in block for block in blocks)
    missing = []
    for block in blocks:
        lines = block.splitlines()
        for node in ast.walk(ast.parse(block)):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for top in {name.split(".")[0] for name in names}:
                installed = top in sys.stdlib_module_names or top == "theseus" or main & {
                    normal(dist) for dist in owners.get(top, [])}
                if not installed and "pip install" not in lines[node.lineno - 1]:
                    missing.append(f"{top}: {lines[node.lineno - 1].strip()}")
    assert not missing, f"README python imports what the main install lacks, without saying how to install it: {missing}"


if __name__ == "__main__":
    print(lock(), end="")
