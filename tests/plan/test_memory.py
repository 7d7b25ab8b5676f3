"""Will it fit: the step's memory against the device's, and the advice when it does not."""

from __future__ import annotations

import jax
import pytest

from support import ROOT, run_python
from theseus.plan.memory import check_fit, device_memory

MiB = 2**20
# 100 MiB of params, optimizer state and batch, 400 MiB of activations: 500 MiB in all
STEP = {"argument": 100 * MiB, "output": 100 * MiB, "alias": 100 * MiB, "temp": 400 * MiB, "total": 500 * MiB}


def fit(limit_mib: float, **kwargs):
    options = {"batch_size": 32, "grad_accum": 1, "parallel": 2, **kwargs}
    return check_fit(STEP, int(limit_mib * MiB), "test", **options)


def test_a_step_within_the_limit_fits():
    verdict = fit(500)
    assert verdict.fits and verdict.advice == "" and verdict.rows()[1] == ("fits", "yes: the step needs 500 MiB")


def test_the_smallest_grad_accum_that_divides_the_batch_and_fits_is_named():
    # 100 + 400 / g <= 160 -> g >= 6.67; 32 / 2 devices = 16 per device: g must divide 16 -> 8
    verdict = fit(160)
    assert not verdict.fits and verdict.rows()[1] == ("fits", "NO: the step needs 500 MiB")
    assert verdict.message().startswith("theseus: warning: the step needs 500 MiB per device, more than the "
                                        "160 MiB of the device (test): set trainer.grad_accum=8")
    assert verdict.advice == "set trainer.grad_accum=8 (estimated 150 MiB if activations scale with the micro-batch)"
    # measured at grad_accum=2, the activations of a whole batch are 800 MiB: 100 + 800 / g <= 160 -> 16
    assert fit(160, grad_accum=2).advice.startswith("set trainer.grad_accum=16 (estimated 150 MiB")
    assert fit(300, grad_accum=1).advice.startswith("set trainer.grad_accum=2 (estimated 300 MiB")
    assert fit(300, remat="dots").advice.endswith("(architecture.remat=full may also help)")


def test_what_nothing_fixes_is_said():
    assert fit(90).advice.startswith("parameters, optimizer state and batch alone take 100 MiB: shard them")
    assert fit(101).advice == ("no trainer.grad_accum dividing the batch is estimated to fit: lower "
                               "trainer.batch_size or architecture.seq_len, or shard over more devices")


def test_the_limit_of_a_cpu_device_is_the_host_ram():
    limit, source = device_memory(jax.devices("cpu")[0])
    assert source == "host RAM" and limit > 2**28


@pytest.mark.slow
@pytest.mark.parametrize("limit, expected", [(None, "│ yes: the step needs"),
                                             (100_000, "other change(s) hold more than that in parameters, "
                                                       "optimizer state and gradients alone")])
def test_dry_run_says_whether_the_step_fits(tmp_path, limit, expected):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((ROOT / "theseus" / "training" / "trainer.py").read_text())
    extra = [f"trainer.memory_limit={limit}"] if limit else []
    proc = run_python("-m", "theseus.run", "+experiment=gpt_tiny", "trainer.dry_run=true", "logger.mode=disabled",
                      "data.source=text", f"data.path={corpus}", f"data.cache_dir={tmp_path / 'cache'}",
                      f"hydra.run.dir={tmp_path / 'run'}", *extra, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert expected in proc.stderr and ("theseus: warning: the step needs" in proc.stderr) is bool(limit)
