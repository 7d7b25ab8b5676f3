"""Peak FLOP/s: the device_kind table against the strings JAX reports, the cached calibration."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support import tpu_mesh
from theseus.base import hardware
from theseus.base.hardware import CHIPS, check_attention_impl, lookup, measure_peak, peak_flops
from theseus.config import ConfigError

# device_kind strings as JAX reports them (TPU runtime names; CUDA device names on NVIDIA).
REAL = {
    "TPU v2": "TPU v2",
    "TPU v3": "TPU v3",
    "TPU v4": "TPU v4",
    "TPU v5 lite": "TPU v5e",
    "TPU v5e": "TPU v5e",
    "TPU v5": "TPU v5p",
    "TPU v5p": "TPU v5p",
    "TPU v6 lite": "TPU v6e",
    "TPU7x": "TPU7x",
    "NVIDIA A10": "NVIDIA A10",
    "NVIDIA A100-SXM4-80GB": "NVIDIA A100",
    "NVIDIA A100-SXM4-40GB": "NVIDIA A100",
    "NVIDIA A100-PCIE-40GB": "NVIDIA A100",
    "NVIDIA A100 80GB PCIe": "NVIDIA A100",
    "NVIDIA L4": "NVIDIA L4",
    "NVIDIA L40": "NVIDIA L40",
    "NVIDIA L40S": "NVIDIA L40S",
    "NVIDIA H100 80GB HBM3": "NVIDIA H100 SXM",
    "NVIDIA H100 PCIe": "NVIDIA H100 PCIe",
    "NVIDIA H100 NVL": "NVIDIA H100 NVL",
    "NVIDIA GH200 480GB": "NVIDIA GH200",
    "NVIDIA H200": "NVIDIA H200 SXM",
    "NVIDIA H200 NVL": "NVIDIA H200 NVL",
    "NVIDIA B200": "NVIDIA B200",
}
UNKNOWN = ["cpu", "TPU v4 lite", "Tesla T4", "Tesla V100-SXM2-16GB", "NVIDIA A10G", "NVIDIA GeForce RTX 4090"]


@pytest.mark.parametrize("kind", REAL)
def test_each_real_device_kind_matches_exactly_one_entry(kind):
    matches = [chip.name for chip in CHIPS if re.fullmatch(chip.pattern, kind, re.IGNORECASE)]
    assert matches == [REAL[kind]]
    assert lookup(kind).name == REAL[kind]


@pytest.mark.parametrize("kind", UNKNOWN)
def test_untabled_kinds_match_nothing(kind):
    assert lookup(kind) is None


def table_peak(kind: str, dtype) -> float:
    """The peak ``peak_flops`` gives a device of ``kind`` from the table."""
    peak, source = peak_flops(SimpleNamespace(device_kind=kind, platform="gpu"), dtype)
    assert source == f"table: {lookup(kind).name}"
    return peak


def test_table_peaks_by_dtype():
    assert table_peak("NVIDIA H200", jnp.bfloat16) == 989.5e12
    assert table_peak("NVIDIA H200", "float32") == 494.5e12  # TF32: JAX's default f32 precision
    assert table_peak("NVIDIA H200 NVL", "bfloat16") == 835.5e12
    assert table_peak("NVIDIA H100 PCIe", jnp.bfloat16) == 756.5e12
    assert table_peak("TPU v5 lite", jnp.bfloat16) == 197e12
    assert table_peak("TPU v5", jnp.bfloat16) == 459e12
    assert table_peak("TPU v6 lite", np.float32) == 918e12  # one bf16 pass by default on TPU
    assert table_peak("nvidia  h200 ", jnp.bfloat16) == 989.5e12  # spacing and case
    assert lookup("NVIDIA H200").peak(jnp.float16) is None  # not tabled: measured instead


def test_calibration_is_positive_and_keeps_the_best(tmp_path, monkeypatch):
    cache = tmp_path / "peaks.json"
    first = measure_peak(jnp.float32, cache_path=cache)
    assert first > 1e8  # any CPU does 100 MFLOP/s
    key = f"cpu|float32|{hardware._cpu_count()}"
    assert json.loads(cache.read_text()) == {key: first}
    monkeypatch.setattr(hardware, "_measure", lambda dtype, device: first / 2)  # a loaded machine
    assert measure_peak(jnp.float32, cache_path=cache) == first
    monkeypatch.setattr(hardware, "_measure", lambda dtype, device: first * 2)  # a quieter one
    assert measure_peak(jnp.float32, cache_path=cache) == first * 2
    assert json.loads(cache.read_text()) == {key: first * 2}
    monkeypatch.setattr(hardware, "_measure", lambda dtype, device: 7.0)
    assert measure_peak(jnp.bfloat16, cache_path=cache) == 7.0  # another dtype, another entry
    assert set(json.loads(cache.read_text())) == {key, f"cpu|bfloat16|{hardware._cpu_count()}"}


def test_peak_flops_sources(tmp_path, monkeypatch):
    h200 = SimpleNamespace(device_kind="NVIDIA H200", platform="gpu")
    assert peak_flops(h200, jnp.bfloat16) == (989.5e12, "table: NVIDIA H200 SXM")
    assert peak_flops(h200, jnp.bfloat16, override=1e12) == (1e12, "config")
    with pytest.raises(ConfigError, match="trainer.peak_flops"):
        peak_flops(h200, jnp.bfloat16, override=0.0)

    cpu = jax.devices("cpu")[0]
    shared = len(jax.local_devices(backend="cpu"))
    monkeypatch.setattr(hardware, "CACHE", tmp_path / "peaks.json")
    monkeypatch.setattr(hardware, "_measure", lambda dtype, device: 8e9)
    monkeypatch.setattr(hardware, "processor", lambda: None)  # a host that does not describe its processor
    assert peak_flops(cpu, jnp.float32) == (8e9 / shared, "measured")


def test_the_backend_is_the_platform_of_the_mesh_in_force():
    assert hardware.backend() == "cpu"
    with jax.set_mesh(tpu_mesh({"data": 2, "tensor": 2})):  # a TPU slice's compile-only devices
        assert hardware.backend() == "tpu"
    with jax.set_mesh(jax.sharding.Mesh(jax.devices("cpu"), ("data",))):
        assert hardware.backend() == "cpu"


def test_cudnn_attention_needs_a_gpu_and_half_precision(monkeypatch):
    check_attention_impl(None, jnp.float32)  # JAX chooses: any backend
    check_attention_impl("xla", jnp.float32)
    with pytest.raises(ConfigError, match="attention_impl=cudnn needs an NVIDIA GPU, but the backend is cpu"):
        check_attention_impl("cudnn", jnp.bfloat16)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    check_attention_impl("cudnn", jnp.bfloat16)
    with pytest.raises(ConfigError, match="needs bfloat16 or float16 activations, not float32"):
        check_attention_impl("cudnn", jnp.float32)
