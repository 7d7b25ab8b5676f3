"""The wheels an offline GPU machine lacks to run ``gpu.py``, made here: theseus's own (its code and
its entry points, through which it finds its options) and what theseus needs that the
machine's Python does not have: Hydra, OmegaConf, ANTLR (OmegaConf's parser), gguf (theseus's
tokenizers read GGUF files), Jinja2 and MarkupSafe (chat templates) and PyYAML (a fallback:
transformers usually brings it). No package index is reachable there, so they travel
with the repository as the device tool's ``carry`` path; ``bootstrap.py`` installs them there.

    python benchmarks/gpu_bundle.py          # -> benchmarks/wheels/ (git-ignored)

The dependencies are packed from this environment's own installed files (their RECORD), so they
are exactly the versions tested here and the bundle is made without a package index.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import zipfile
from importlib.metadata import distribution
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / "benchmarks" / "wheels"  # bootstrap.py reads them from here too
MISSING_ON_DEVICE = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "gguf", "jinja2", "MarkupSafe", "PyYAML")
NOT_PACKED = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}  # written by an installer, not in a wheel


def theseus_wheel(out: Path) -> Path:
    """Build theseus's wheel from this checkout into ``out``."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True)
    return next(out.glob("theseus-*.whl"))


def pack_installed(name: str, out: Path) -> Path:
    """A wheel in ``out`` of installed distribution ``name``, from the files its RECORD lists
    (compiled ``__pycache__`` and scripts outside site-packages left out), tagged as its WHEEL
    file says: a binary one fits only this Python and platform."""
    dist = distribution(name)
    tags = [line.split(":", 1)[1].strip() for line in dist.read_text("WHEEL").splitlines() if line.startswith("Tag:")]
    py, abi, plat = (".".join(dict.fromkeys(tag.split("-")[i] for tag in tags)) for i in range(3))
    files = [f for f in dist.files if f.parts[0] != ".." and "__pycache__" not in f.parts and f.name not in NOT_PACKED]
    dist_info = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    wheel = out / f"{dist_info.removesuffix('.dist-info')}-{py}-{abi}-{plat}.whl"
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            data = path.locate().read_bytes()
            archive.writestr(path.as_posix(), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path.as_posix()},sha256={digest},{len(data)}")
        archive.writestr(f"{dist_info}/RECORD", "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n")
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=WHEELS, help="folder for the wheels (its old ones removed)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):
        old.unlink()
    wheels = [theseus_wheel(args.out), *(pack_installed(name, args.out) for name in MISSING_ON_DEVICE)]
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 1024:8.0f} KiB  {wheel}")


if __name__ == "__main__":
    main()
