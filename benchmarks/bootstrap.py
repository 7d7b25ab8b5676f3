"""Run a benchmark script on a machine whose Python lacks some of theseus's requirements (an offline
GPU: JAX, Flax, Optax, Orbax, tokenizers and transformers, but no Hydra, no theseus, no package
index). Installs the wheels of the bundle (``gpu_bundle.py`` makes it) whose distribution this
Python does not have, then runs the script in a process that sees them:

    python3 benchmarks/bootstrap.py benchmarks/gpu.py --budget 240

Installing is unzipping each wheel into one folder (``--target``, emptied first) put on
``PYTHONPATH``: its dist-info comes along, so theseus's entry points are found. No pip is
needed. Where every distribution is already installed nothing is unpacked and the script runs
as it would alone. This checkout goes first on the path: the code that runs is the tree's, the
theseus wheel brings its metadata.

Standard library only, and ``packaging`` (transformers and Hydra require it) for wheel tags.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from gpu_bundle import ROOT, WHEELS
from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename


class BundleError(Exception):
    """The bundle is missing or does not fit this Python (one line for the user)."""


def missing(wheels: Path) -> list[Path]:
    """The wheels in folder ``wheels`` whose distribution this Python does not have installed."""
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not found:
        raise BundleError(f"no wheels in {wheels}: make them with `python benchmarks/gpu_bundle.py` on a machine "
                          f"with the full environment, and bring the folder (the run tool's carry)")
    need = []
    for wheel in found:
        try:
            distribution(parse_wheel_filename(wheel.name)[0])
        except PackageNotFoundError:
            need.append(wheel)
    return need


def check_fits(wheel: Path) -> None:
    """Refuse ``wheel`` unless one of its tags fits this Python (a pure one always does)."""
    name, _, _, tags = parse_wheel_filename(wheel.name)
    if not tags & set(sys_tags()):
        raise BundleError(f"{wheel.name} does not fit this Python ({next(iter(sys_tags()))}): make the bundle with "
                          f"a Python of the same version and platform, or install {name} here")


def unpack(wheel: Path, target: Path) -> None:
    """Install ``wheel`` into folder ``target`` by unzipping it: what an installer does for a
    package that brings no scripts, as the bundle's do."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=WHEELS, help="the bundle (gpu_bundle.py --out)")
    parser.add_argument("--target", type=Path, help="where the wheels are unpacked (default: WHEELS/site)")
    parser.add_argument("script", type=Path, help="the Python script to run, e.g. benchmarks/gpu.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args()
    target = args.target or args.wheels / "site"
    try:
        need = missing(args.wheels)
        for wheel in need:
            check_fits(wheel)
    except BundleError as exc:
        sys.exit(f"theseus: error: {exc}")
    if need:
        shutil.rmtree(target, ignore_errors=True)
        for wheel in need:
            unpack(wheel, target)
    path = [str(ROOT), *([str(target.resolve())] if need else []), os.environ.get("PYTHONPATH", "")]
    print(f"bootstrap: installed {', '.join(w.name for w in need)} into {target}" if need
          else "bootstrap: every wheel's distribution is installed here: nothing unpacked", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    os.execve(sys.executable, [sys.executable, str(args.script), *args.args], env)


if __name__ == "__main__":
    main()
