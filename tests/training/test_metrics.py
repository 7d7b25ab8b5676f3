"""Throughput and MFU from known timings; XLA's FLOP count and memory of a real jitted function."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

from theseus.training.metrics import format_bytes, format_duration, format_si, memory_report, throughput, xla_flops


def test_throughput_from_a_known_timing():
    # 8 sequences of 1024 tokens, 6e12 FLOPs, in 0.5 s on 4 devices of 1e13 FLOP/s each.
    out = throughput(step_time=0.5, tokens=8 * 1024, flops=6e12, peak=1e13, n_devices=4)
    assert out == pytest.approx({"tokens_per_s": 16384.0, "flops_per_s": 1.2e13, "mfu": 0.3})
    with pytest.raises(ValueError, match="step_time"):
        throughput(step_time=0.0, tokens=1, flops=1.0, peak=1.0, n_devices=1)
    with pytest.raises(ValueError, match="n_devices"):
        throughput(step_time=1.0, tokens=1, flops=1.0, peak=1.0, n_devices=0)


def _matmul(m=64, k=128, n=32):
    a, b = jnp.ones((m, k), jnp.float32), jnp.ones((k, n), jnp.float32)
    return jax.jit(lambda a, b: a @ b).lower(a, b).compile()


def test_xla_flops_of_a_real_matmul_and_other_shapes():
    assert xla_flops(_matmul()) == 2 * 64 * 128 * 32
    as_list = SimpleNamespace(cost_analysis=lambda: [{"flops": 10.0}, {"flops": 5.0}])
    assert xla_flops(as_list) == 15.0  # older JAX: one dict per module
    assert xla_flops(SimpleNamespace(cost_analysis=lambda: None)) is None
    assert xla_flops(SimpleNamespace(cost_analysis=lambda: {"bytes accessed": 3.0})) is None


def test_memory_report_of_a_real_matmul():
    report = memory_report(_matmul())
    assert report["argument"] == (64 * 128 + 128 * 32) * 4
    assert report["output"] == 64 * 32 * 4
    assert report["total"] == report["argument"] + report["output"] - report["alias"] + report["temp"]
    assert set(report) == {"argument", "output", "alias", "temp", "generated_code", "total"}
    assert memory_report(SimpleNamespace(memory_analysis=lambda: None)) == {}


def test_human_formats():
    assert format_si(12345) == "12.3k"
    assert format_si(999.7) == "1k"
    assert format_si(42) == "42"
    assert format_si(1.234e12, "FLOP") == "1.23 TFLOP"
    assert format_si(5e15, "FLOP/s") == "5 PFLOP/s"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3.25 * 2**30) == "3.25 GiB"
    assert format_duration(42.4) == "42s"
    assert format_duration(83) == "1m23s"
    assert format_duration(2 * 3600 + 5 * 60) == "2h05m"
    assert format_duration(3 * 86400 + 4 * 3600) == "3d04h"
