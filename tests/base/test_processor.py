"""The host processor from /proc/cpuinfo: its cores, clock and vector units, and the peak they make."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from theseus.base import hardware
from theseus.base.hardware import peak_flops
from theseus.base.processor import parse, processor


def cpuinfo(n: int, *, vendor: str = "GenuineIntel", family: int = 6, model: int = 143,
            name: str = "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", flags: str = "sse2 avx avx2 fma",
            mhz: float = 2700.0, threads_per_core: int = 1) -> str:
    """``/proc/cpuinfo`` of ``n`` logical CPUs, ``threads_per_core`` of them on each core."""
    return "\n\n".join(
        f"processor\t: {i}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
        f"model name\t: {name}\ncpu MHz\t\t: {mhz}\nphysical id\t: 0\ncore id\t\t: {i // threads_per_core}\n"
        f"flags\t\t: {flags}" for i in range(n)) + "\n"


ZEN4 = cpuinfo(2, vendor="AuthenticAMD", family=25, model=17, name="AMD EPYC", mhz=2596.134,
               flags="sse2 avx fma avx2 avx512f avx512dq avx512_bf16 avx512_vnni")
SAPPHIRE_RAPIDS = cpuinfo(4, threads_per_core=2, flags="sse2 avx fma avx2 avx512f avx512_bf16 amx_bf16 amx_tile")
ARM = ("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16\n"
       "CPU implementer\t: 0x41\nCPU part\t: 0xd40\n\n")


def test_amd_zen4_runs_avx512_on_256_bit_units():
    """This project's machine: AVX-512 on AMD family 25 is double-pumped 256-bit; bfloat16 at twice."""
    cpu = parse(ZEN4)
    assert (cpu.model, cpu.cores, cpu.ghz, cpu.clock, cpu.fma_bits) == ("AMD EPYC", 2, 2.596134, "cpu MHz", 256)
    assert cpu.flops_per_cycle(jnp.float32) == 32 and cpu.flops_per_cycle(jnp.bfloat16) == 64
    assert cpu.peak(jnp.float32) == pytest.approx(2 * 2.596134e9 * 32)
    assert cpu.extensions == ["avx512_bf16", "avx512_vnni", "avx512f", "avx2", "fma", "avx"]
    assert "2 cores x 2.60 GHz (cpu MHz) x 32 float32 FLOP/cycle (2 x 256-bit FMA units, AVX-512)" in cpu.describe(
        jnp.float32)


def test_intel_avx512_and_amx_count_physical_cores_at_the_named_clock():
    cpu = parse(SAPPHIRE_RAPIDS)
    assert (cpu.cores, cpu.ghz, cpu.clock, cpu.fma_bits) == (2, 2.7, "model name", 512)  # 4 threads on 2 cores
    assert cpu.flops_per_cycle(jnp.float32) == 64 and cpu.flops_per_cycle(jnp.bfloat16) == 1024
    assert cpu.peak(jnp.bfloat16) == pytest.approx(2 * 2.7e9 * 1024)
    assert "AMX-BF16" in cpu.describe(jnp.bfloat16)
    assert parse(SAPPHIRE_RAPIDS, cpus={0, 1}).cores == 1  # the cores this process may run on
    assert parse(SAPPHIRE_RAPIDS, max_khz=3.8e6).ghz == 3.8  # cpufreq's maximum first


@pytest.mark.parametrize(("info", "bits", "fp32"), [
    (cpuinfo(1, flags="sse2 avx avx2 fma"), 256, 32),  # Haswell and later without AVX-512
    (cpuinfo(1, flags="sse2 sse4_2"), 128, 16),  # SSE only
    (cpuinfo(1, vendor="AuthenticAMD", family=23, model=1, flags="sse2 avx avx2 fma"), 128, 16),  # Zen 1
    (cpuinfo(1, vendor="AuthenticAMD", family=23, model=49, flags="sse2 avx avx2 fma"), 256, 32),  # Zen 2
    (cpuinfo(1, vendor="AuthenticAMD", family=26, model=2, flags="sse2 avx2 fma avx512f"), 512, 64),  # Zen 5
], ids=["avx2", "sse", "zen1", "zen2", "zen5"])
def test_fma_width_by_vendor_and_family(info, bits, fp32):
    cpu = parse(info)
    assert (cpu.fma_bits, cpu.flops_per_cycle(jnp.float32), cpu.flops_per_cycle(jnp.bfloat16)) == (bits, fp32, fp32)
    assert cpu.flops_per_cycle(jnp.float64) == fp32 // 2


def test_arm_without_a_clock_has_no_peak():
    cpu = parse(ARM)
    assert cpu.model == "Arm (implementer 0x41, part 0xd40)" and cpu.fma_bits == 128
    assert cpu.flops_per_cycle(jnp.bfloat16) == 32  # bf16 dot products at twice NEON's float32
    assert cpu.ghz is None and cpu.peak(jnp.float32) is None  # the caller measures instead


def test_this_host():
    cpu = processor()
    if cpu is None:
        pytest.skip("no /proc/cpuinfo")
    assert cpu.cores >= 1 and cpu.model and (cpu.peak(jnp.float32) is None or cpu.peak(jnp.float32) > 1e9)


def test_a_cpu_device_gets_its_share_of_the_vector_peak(monkeypatch):
    host = parse(ZEN4)
    monkeypatch.setattr(hardware, "processor", lambda: host)
    peak, source = peak_flops(jax.devices("cpu")[0], jnp.float32)
    shared = len(jax.local_devices(backend="cpu"))
    assert peak == host.peak(jnp.float32) / shared
    assert source.startswith("vector peak: AMD EPYC: 2 cores x 2.60 GHz (cpu MHz) x 32 float32 FLOP/cycle")
