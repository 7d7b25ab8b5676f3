"""Safe loading: no load path unpickles, and no secret from the environment is saved.

- The package source is scanned (its syntax tree, so comments and docstrings do not count) for
  pickle and its relatives: importing pickle, cloudpickle, dill, shelve, marshal, jsonpickle;
  ``torch.load``, ``joblib.load``, ``pandas.read_pickle``; ``np.load`` or
  ``np.lib.format.read_array`` without ``allow_pickle=False``; ``allow_pickle=True``; an unsafe
  ``yaml.load``.
- A saved Model holding a pickled array is refused without running the pickle.
- A short real run (``+experiment=gpt_tiny``, logger.mode=offline) with secrets in its
  environment writes none of them into any file of its run directory (``.hydra/``, W&B, the
  checkpoints, metrics) nor prints them.
"""

from __future__ import annotations

import ast
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from support import ROOT, run_python

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

PACKAGE = ROOT / "theseus"

UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "shelve", "marshal", "jsonpickle"}
UNSAFE_CALLS = {"torch.load", "joblib.load", "pandas.read_pickle", "pd.read_pickle", "yaml.unsafe_load",
                "yaml.full_load", "yaml.load_all", "pickle.load", "pickle.loads"}
NUMPY = {"np", "numpy", "jnp"}  # np.load and np.lib.format.read_array need allow_pickle=False


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def unsafe_loads(source: str, filename: str = "<source>") -> list[str]:
    """Every pickle-capable load in ``source``, as ``file:line: what`` (a loader class of the
    module's own is safe when it derives from a SafeLoader)."""
    found, tree = [], ast.parse(source, filename)
    safe_loaders = {"SafeLoader", "CSafeLoader"}
    for node in ast.walk(tree):
        bases = [_dotted(base).rsplit(".", 1)[-1] for base in getattr(node, "bases", [])]
        if isinstance(node, ast.ClassDef) and safe_loaders.intersection(bases):
            safe_loaders.add(node.name)
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append(f"{where}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            keywords = {k.arg: k.value for k in node.keywords}
            allow = keywords.get("allow_pickle")
            if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
                found.append(f"{where}: {name}(allow_pickle={ast.unparse(allow)})")
            elif name in UNSAFE_CALLS:
                found.append(f"{where}: {name}")
            elif (name.split(".")[0] in NUMPY and name.rsplit(".", 1)[-1] in ("load", "read_array")
                  and allow is None):
                found.append(f"{where}: {name} without allow_pickle=False")
            elif name == "yaml.load":
                loader = keywords.get("Loader") or (node.args[1] if len(node.args) > 1 else None)
                if loader is None or _dotted(loader).rsplit(".", 1)[-1] not in safe_loaders:
                    found.append(f"{where}: yaml.load without a SafeLoader")
    return found


@pytest.mark.parametrize("planted", [
    "import pickle", "import cloudpickle as cp", "from dill import loads", "import marshal",
    "import torch\nx = torch.load('f.pt')", "import numpy as np\nnp.load('a.npy')",
    "import numpy as np\nnp.load('a.npy', allow_pickle=True)", "np.lib.format.read_array(f)",
    "import yaml\nyaml.load(text)", "import yaml\nyaml.load(t, Loader=yaml.Loader)",
    "import yaml\nclass Tags(yaml.Loader): pass\nyaml.load(t, Loader=Tags)", "import yaml\nyaml.unsafe_load(text)",
    "import joblib\njoblib.load('m')",
    "import pandas as pd\npd.read_pickle('x')",
])
def test_the_scan_finds_planted_pickle(planted):
    assert unsafe_loads(planted)


def test_the_scan_accepts_safe_loads():
    safe = ("import numpy as np, yaml, json\nnp.load('a.npy', allow_pickle=False)\n"
            "np.lib.format.read_array(f, allow_pickle=False)\nyaml.load(t, Loader=yaml.SafeLoader)\n"
            "class Tags(yaml.SafeLoader): pass\nyaml.load(t, Loader=Tags)\n"
            "yaml.safe_load(t)\njson.loads(t)\n# import pickle in a comment\n'''import pickle in a docstring'''\n")
    assert unsafe_loads(safe) == []


# Pickle between a run and its own checkpoint writer: over the anonymous pipe the run made for the
# process it started, which no file and no other process reaches (the train state's tree goes
# through it). Nothing else in these files may unpickle.
OWN_PIPE = {"theseus/training/checkpoint_writer.py": {"import pickle", "pickle.load"},
            "theseus/training/checkpoint_server.py": {"import pickle", "pickle.load"}}


def test_no_load_path_uses_pickle():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    found = [hit for path in files for hit in unsafe_loads(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
             if hit.split(": ", 1)[1] not in OWN_PIPE.get(str(path.relative_to(ROOT)), ())]
    assert found == []
    assert all((ROOT / name).is_file() for name in OWN_PIPE)  # no exception outlives its file


def test_a_saved_model_with_a_pickled_array_is_refused(tmp_path):
    from theseus.stateful.model import Model

    marker = tmp_path / "pickle-ran"

    class Payload:  # unpickling this creates ``marker``: proof that the pickle ran
        def __reduce__(self):
            return open, (str(marker), "w")

    array = np.empty(1, dtype=object)
    array[0] = Payload()
    path = tmp_path / "model.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json", json.dumps({"__array__": 0, "dtype": "float32"}))
        with archive.open("arrays/0.npy", "w") as f:
            np.lib.format.write_array(f, array, allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        Model.load(path)
    assert not marker.exists()


# -- secrets ----------------------------------------------------------------------------------

PLAIN = {  # in the environment only
    "WANDB_API_KEY": "wandbkey-5e3b9f1c7a2d4e6f8091a2b3c4d5e6f7a8b9c0d1",
    "MY_SERVICE_TOKEN": "svc-token-Zq81KxP0wLr2",
}
INTERPOLATED = {  # in the environment, and pulled into the config by ${oc.env:...}
    "OTHER_API_KEY": "otherkey-H7mQ3vT9sY1b",
    "DB_PASSWORD": "dbpass-Ue4Wn6Ro8Ic0",
}


def files_holding(folder: Path, secrets: dict[str, str]) -> list[str]:
    """``relative/path: NAME`` for every file under ``folder`` whose bytes contain a secret."""
    hits = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{path.relative_to(folder)}: {name}" for name, value in secrets.items()
                     if value.encode() in data]
    return hits


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("secrets")
    corpus = tmp / "corpus.txt"
    corpus.write_text("".join(Path(m.__file__).read_text(encoding="utf-8") for m in (json, pytest)), encoding="utf-8")
    env = {**PLAIN, **INTERPOLATED, "WANDB_CONFIG_DIR": str(tmp / "wandb-config"),
           "WANDB_CACHE_DIR": str(tmp / "wandb-cache"), "WANDB_DATA_DIR": str(tmp / "wandb-data")}
    proc = run_python(
        "-m", "theseus.run", "+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}",
        f"data.cache_dir={tmp / 'cache'}", f"hydra.run.dir={tmp / 'run'}", "logger.mode=offline",
        "trainer.max_steps=3", "trainer.batch_size=4", "trainer.log_every=1", "trainer.eval_every=0",
        "trainer.eval_batches=1", "trainer.checkpoint_every=0",
        "logger.name=run-${oc.env:OTHER_API_KEY}", "logger.tags=[${oc.env:DB_PASSWORD}]",
        env=env, cwd=tmp, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp / "run"
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "metrics.jsonl").is_file()
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb")), "no W&B run was written"
    assert list((run / "checkpoints").iterdir()), "no checkpoint was written"
    return tmp, proc.stdout + proc.stderr


def test_no_secret_from_the_environment_is_saved(secret_run):
    tmp, console = secret_run
    assert files_holding(tmp / "run", PLAIN) == []  # .hydra/, W&B, checkpoints, metrics, run.log
    assert files_holding(tmp, PLAIN) == []  # W&B's own config and cache folders too
    assert not [name for name, value in PLAIN.items() if value in console]


def test_no_secret_interpolated_from_the_environment_is_saved(secret_run):
    tmp, console = secret_run
    assert files_holding(tmp / "run", INTERPOLATED) == []
    assert not [name for name, value in INTERPOLATED.items() if value in console]
