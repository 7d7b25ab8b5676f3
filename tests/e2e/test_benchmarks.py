"""The benchmark scripts run, small, on the CPU: the GPU script must not first fail on an offline
GPU (rehearsed from its bundle in an environment like that machine's), and the FLOPs script's
counts are checked against XLA's compiled program."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support import ROOT, bare_env, fresh_python, run_python, site_of

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

# what an offline GPU machine's Python has (and what these require): no Hydra, no W&B, no theseus
ON_DEVICE = ["jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "tokenizers", "transformers"]
ABSENT = ("import importlib.util as u; "
          "print(*(m for m in ('hydra', 'omegaconf', 'wandb', 'theseus', 'sqlalchemy', 'yaml') if not u.find_spec(m)))")


def bench(tmp_path: Path, script: str, *args: str) -> dict:
    """Run ``benchmarks/SCRIPT.py ARGS`` writing into ``tmp_path``; its JSON record's results."""
    proc = run_python(str(ROOT / "benchmarks" / f"{script}.py"), *args, env={"BENCHMARK_RESULTS": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / f"{script}.json").read_text())["results"]


def test_model_flops_equal_the_matrix_products_xla_compiles(tmp_path):
    tiny = bench(tmp_path, "flops", "--sizes", "gpt_tiny")["gpt_tiny"]
    assert tiny["xla_dots_flops"] == tiny["jaxpr_dots_flops"] == tiny["model_flops"] > 0
    assert 1.0 < tiny["xla_over_model"] < 1.1  # XLA's total adds the elementwise work (4.8% here)
    assert abs(tiny["formula_over_model"] - 1) < 0.02


def test_the_accelerator_script_runs_from_its_bundle_where_hydra_and_theseus_are_not_installed(tmp_path):
    """The offline accelerator machine's case, rehearsed on the CPU: a Python with only what that machine has
    (JAX, Flax, Optax, Orbax, tokenizers, transformers and their requirements), the bundle made here,
    the bootstrap installing what is missing and running accelerator.py small."""
    wheels, results = tmp_path / "wheels", tmp_path / "results"
    bundle = run_python(str(ROOT / "benchmarks" / "gpu_bundle.py"), "--out", str(wheels))
    assert bundle.returncode == 0, bundle.stderr[-3000:]
    python = fresh_python(tmp_path / "bare", site_of(ON_DEVICE, tmp_path / "site"))
    absent = subprocess.run([python, "-c", ABSENT], capture_output=True, text=True, cwd=tmp_path, env=bare_env())
    assert absent.stdout.split() == ["hydra", "omegaconf", "wandb", "theseus", "sqlalchemy"], absent.stderr
    target = tmp_path / "installed"
    proc = subprocess.run([python, ROOT / "benchmarks" / "bootstrap.py", "--wheels", wheels, "--target", target,
                           ROOT / "benchmarks" / "accelerator.py", "--models", "gpt_tiny", "--batches", "2",
                           "--sections", "train", "checkpoint", "build", "--rounds", "1"],
                          capture_output=True, text=True, cwd=ROOT, env=bare_env(BENCHMARK_RESULTS=str(results)),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = {path.name.split("-")[0] for path in target.glob("*.dist-info")}
    assert installed == {"theseus", "hydra_core", "omegaconf", "antlr4_python3_runtime", "gguf",
                         "jinja2", "markupsafe"}  # PyYAML: transformers'
    record = json.loads((results / "accelerator.json").read_text())["results"]
    for name in ("gpt_tiny", "gpt_tiny batch 2"):  # each built, measured and freed in turn
        step = record["train"][name]
        assert "mfu" in step, step  # else its error
        assert 0 < step["mfu"] < 1 and step["tokens_per_s"] > 0 and step["build_s"] > 0
        assert step["mfu_6n"] == pytest.approx(step["mfu"], rel=0.2)  # theseus's count against 6N + 12·L·d·T
    saved = record["checkpoint"]["gpt_tiny"]
    assert saved["bytes"] > 0 and 0 < saved["held_s"] <= saved["written_s"]
    built = record["build"]["gpt_tiny"]  # each in a process of its own, the second from the first's cache
    assert built["device"] == record["device"] and 0 < built["cached_s"] < built["first_s"]


def test_bootstrap_unpacks_nothing_where_everything_is_installed_and_refuses_a_bad_bundle(tmp_path):
    wheels, target = tmp_path / "wheels", tmp_path / "installed"
    wheels.mkdir()
    (wheels / "omegaconf-2.3.1-py3-none-any.whl").write_bytes(b"")  # installed here: never opened
    script = tmp_path / "where.py"
    script.write_text("import sys, theseus; print(theseus.__file__, sys.argv[1:])\n")
    bootstrap = str(ROOT / "benchmarks" / "bootstrap.py")
    run = run_python(bootstrap, "--wheels", str(wheels), "--target", str(target), str(script), "--flag", "x",
                     cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == f"{ROOT / 'theseus' / '__init__.py'} ['--flag', 'x']"
    assert not target.exists()
    empty = run_python(bootstrap, "--wheels", str(tmp_path / "none"), str(script), cwd=tmp_path)
    assert empty.returncode != 0 and not empty.stdout
    assert empty.stderr.startswith(f"theseus: error: no wheels in {tmp_path / 'none'}: make them with"), empty.stderr
    assert len(empty.stderr.splitlines()) == 1
    (wheels / "notinstalled-1.0-cp27-cp27mu-linux_x86_64.whl").write_bytes(b"")  # a binary wheel of another Python
    foreign = run_python(bootstrap, "--wheels", str(wheels), "--target", str(target), str(script), cwd=tmp_path)
    assert foreign.returncode != 0 and not foreign.stdout and len(foreign.stderr.splitlines()) == 1
    assert foreign.stderr.startswith("theseus: error: notinstalled-1.0-cp27-cp27mu-linux_x86_64.whl does not fit "
                                     "this Python"), foreign.stderr
    assert not target.exists()


def test_large_dry_run_shards_scanned_params_and_moments_evenly_over_fsdp(tmp_path):
    """The 1.3B script, small: 8 simulated devices (the script sets them), scanned layers."""
    run = bench(tmp_path, "large_dry_run", "--layers", "2", "--d-model", "256", "--heads", "4", "--seq", "64",
                "--vocab", "512", "--policies", "full")["policies"]["full"]
    assert run["devices"] == 8 and run["total_bytes"]["params"] == 4 * run["n_params"]
    for kind in ("params", "opt_state"):  # replicated vectors (norms, biases) keep it just above 1
        assert 1.0 <= run["per_device_over_share"][kind] <= 1.02, kind
    assert run["memory"]["temp"] > 0 and run["fits"]
