"""Helpers shared by tests (importable as ``support``: tests/ is on the path)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import sysconfig
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
# Text that changes only with Python, not with theseus: what test tokenizers are trained on, so that
# editing a source file leaves their merges, and the numbers of the tests they feed, as they were
TEXT = Path(json.__file__)


# A driver script that runs ``module.main(argv)`` for each case of the JSON file given (``{name:
# [module, argv]}``) in one process, and prints ``RESULTS{name: {code, stderr, changed}}``: the
# exit code, what went to stderr, and the files each case created or changed. Hydra's start is
# refused (raises Started), for a sweep as for a single run, so an accepted command creates no
# run directory, trains nothing and submits nothing.
DRIVER = r"""
import hydra

class Started(Exception):
    pass

def refuse(*args, **kwargs):  # Hydra reached: it would create the run directory now
    def decorate(task):
        def start():
            raise Started
        return start
    return decorate

def refuse_run(*args, **kwargs):  # a single run, composed and checked: Hydra would run it now
    raise Started

hydra.main = refuse
import theseus.cli.run
theseus.cli.run.run_composed = refuse_run

import contextlib, io, json, sys, traceback
from pathlib import Path

def listing():
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(Path(".").rglob("*"))}

cases = json.loads(Path(sys.argv[1]).read_text())
results = {}
for name, (module, argv) in cases.items():
    err, before = io.StringIO(), listing()
    sys.argv = [module, *argv]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if module == "theseus.runs":
                import theseus.runs
                try:
                    theseus.runs.load(*argv)
                    code = 0
                except ValueError as exc:  # the API's error, as a user's notebook shows its line
                    print(f"theseus: error: {exc}", file=sys.stderr)
                    code = 2
            else:
                __import__(module)
                code = sys.modules[module].main(argv) or 0
    except SystemExit as exc:
        code = exc.code
    except Started:
        code = "accepted: Hydra would start the run"
    except BaseException as exc:
        code = "raised"
        err.write("".join(traceback.format_exception(exc)))
    after = listing()
    results[name] = {"code": code, "stderr": err.getvalue(),
                     "changed": sorted(p for p in after.keys() | before.keys() if after.get(p) != before.get(p))}
print("RESULTS" + json.dumps(results))
"""


def run_python(*args: str, devices: int | None = None, env: dict | None = None, timeout: int = 600,
               cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in a fresh process (optionally with N simulated CPU devices)."""
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    if devices:
        full_env["XLA_FLAGS"] = f"{full_env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=cwd or ROOT)


def fresh_python(env_dir: Path, site: Path) -> Path:
    """A new virtual environment at ``env_dir`` (no pip, nothing installed) that imports from
    folder ``site``, added as a plain path: the ``.pth`` files inside ``site`` are not processed
    (an editable checkout among them stays out). Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    purelib = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                      text=True).strip()
    (Path(purelib) / "dependencies.pth").write_text(f"{site}\n")
    return python


def bare_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points Python at this checkout or environment
    (``PYTHONPATH``, ``VIRTUAL_ENV``), on the CPU, plus ``extra``. A ``PYTHONPATH`` that is this
    checkout stays: a second worktree tested with the first one's environment imports its own code."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    own = {"PYTHONPATH": str(ROOT)} if os.environ.get("PYTHONPATH") == str(ROOT) else {}
    return {**env, **own, "JAX_PLATFORMS": "cpu", **extra}


def requirement_closure(names: list[str]) -> list[Distribution]:
    """The installed distributions ``names`` and, transitively, every installed one they require
    (markers evaluated, extras followed), each once."""
    found, queue = {}, [Requirement(name) for name in names]
    while queue:
        req = queue.pop()
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:  # an optional requirement this environment does without
            continue
        key = (dist.metadata["Name"].lower(), frozenset(req.extras))
        if key in found:
            continue
        found[key] = dist
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in {"", *req.extras}):
                queue.append(sub)
    return list({dist.metadata["Name"].lower(): dist for dist in found.values()}.values())


def site_of(names: list[str], folder: Path) -> Path:
    """``folder`` holding symlinks to this environment's site-packages entries (packages, modules,
    dist-info) of ``requirement_closure(names)`` and nothing else: a machine with only those."""
    folder.mkdir(parents=True)
    site = Path(sysconfig.get_path("purelib"))
    for dist in requirement_closure(names):
        for top in {path.parts[0] for path in dist.files or [] if path.parts[0] != ".."}:
            if not (folder / top).exists():
                (folder / top).symlink_to(site / top)
    return folder


def wandb_records(path: Path) -> list:
    """The protobuf records of a ``.wandb`` file (LevelDB log format after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, chunk, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def read_params(step_dir: Path) -> list:
    """The params of the checkpoint at ``step_dir`` (``checkpoints/N/state``), read back with Orbax
    alone onto this process's one device (the run may have had a device per core): leaves, as numpy."""
    return list(read_param_paths(step_dir).values())


def read_param_paths(step_dir: Path) -> dict:
    """``read_params`` by path: ``{"h_0/attn/wq": array, ...}``, in the leaves' order."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    reader, one = ocp.StandardCheckpointer(), jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
                          reader.metadata(step_dir.absolute()).item_metadata)
    params = reader.restore(step_dir.absolute(), target)["params"]
    leaves = jax.tree_util.tree_leaves_with_path(params)
    return {"/".join(str(k.key) for k in path): np.asarray(x) for path, x in leaves}


def tpu_mesh(shape: dict[str, int]):
    """A mesh of a TPU v5e slice's compile-only devices (``mesh.target``'s: nothing allocated),
    axes and sizes ``shape``; the test is skipped without the plan extra's libtpu."""
    import numpy as np
    import pytest
    from jax.sharding import Mesh

    pytest.importorskip("libtpu", reason="the plan extra: pip install 'theseus[plan]'")
    from theseus.plan.target import target_named

    devices = target_named(f"tpu:v5e-{max(4, int(np.prod(list(shape.values()))))}").devices
    return Mesh(np.array(devices[:int(np.prod(list(shape.values())))]).reshape(tuple(shape.values())), tuple(shape))
