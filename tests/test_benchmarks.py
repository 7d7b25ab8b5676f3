"""The benchmark scripts run, small, on the CPU: the GPU script must not first fail on a lent
GPU, and the FLOPs script's counts are checked against XLA's compiled program."""

from __future__ import annotations

import json
from pathlib import Path

from support import ROOT, run_python


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


def test_gpu_script_measures_what_builds_and_records_what_does_not(tmp_path):
    configs = bench(tmp_path, "gpu", "--experiment", "gpt_tiny", "--batches", "2", "--impls", "xla", "cudnn",
                    "--rounds", "1", "--variants", "scan remat=full")["configs"]
    assert 0 < configs["xla batch 2"]["mfu"] < 1 and configs["xla batch 2"]["tokens_per_s"] > 0
    scanned = configs["xla batch 2 scan remat=full"]  # the scale knobs, at the first batch and implementation
    assert 0 < scanned["mfu"] < 1 and scanned["build_s"] > 0 and scanned["xla_memory"]["temp"] > 0
    assert configs["cudnn batch 2"]["error"].startswith("ConfigError: architecture.attention_impl=cudnn needs an NVIDIA GPU")


def test_large_dry_run_shards_scanned_params_and_moments_evenly_over_fsdp(tmp_path):
    """The 1.3B script, small: 8 simulated devices (the script sets them), scanned layers."""
    run = bench(tmp_path, "large_dry_run", "--layers", "2", "--d-model", "256", "--heads", "4", "--seq", "64",
                "--vocab", "512", "--policies", "full")["policies"]["full"]
    assert run["devices"] == 8 and run["total_bytes"]["params"] == 4 * run["n_params"]
    for kind in ("params", "opt_state"):  # replicated vectors (norms, biases) keep it just above 1
        assert 1.0 <= run["per_device_over_share"][kind] <= 1.02, kind
    assert run["memory"]["temp"] > 0 and run["fits"]
