"""The host processor from /proc/cpuinfo: its cores, clock and vector units, and the peak they make."""

from __future__ import annotations

import json
import shutil
import subprocess

import jax
import jax.numpy as jnp
import pytest

from theseus.base import hardware
from theseus.base import processor as processor_module
from theseus.base.clock import FMA_LOOP, executable, seconds_per_iteration, vector_width
from theseus.base.hardware import peak_flops
from theseus.base.processor import parse, processor, running


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
    monkeypatch.setattr(hardware, "running", lambda cpu: cpu)  # the clock as reported (measured: below)
    peak, source = peak_flops(jax.devices("cpu")[0], jnp.float32)
    shared = len(jax.local_devices(backend="cpu"))
    assert peak == host.peak(jnp.float32) / shared
    assert source.startswith("vector peak: AMD EPYC: 2 cores x 2.60 GHz (cpu MHz) x 32 float32 FLOP/cycle")


def test_one_logical_cpu_of_each_core_is_timed():
    assert parse(SAPPHIRE_RAPIDS).core_cpus == (0, 2)  # 4 threads on 2 cores: a thread each would halve each
    assert parse(SAPPHIRE_RAPIDS, cpus={1, 2, 3}).core_cpus == (1, 2)  # those this process may run on
    assert parse(ARM).core_cpus == (0,)


def test_the_reported_clock_is_read_from_the_system_files(tmp_path, monkeypatch):
    """A fake ``/proc/cpuinfo`` and cpufreq folder: its maximum, the boost clock, is the reported one."""
    (tmp_path / "cpuinfo").write_text(ZEN4)
    for cpu, khz in ((0, 3700000), (1, 3600000)):
        (tmp_path / f"cpu{cpu}" / "cpufreq").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "cpufreq" / "cpuinfo_max_freq").write_text(f"{khz}\n")
    monkeypatch.setattr(processor_module, "CPUINFO", tmp_path / "cpuinfo")
    monkeypatch.setattr(processor_module, "CPUFREQ", tmp_path)
    monkeypatch.setattr(processor_module.os, "sched_getaffinity", lambda pid: {0, 1})
    cpu = processor.__wrapped__()
    assert (cpu.model, cpu.cores, cpu.ghz, cpu.clock) == ("AMD EPYC", 2, 3.7, "cpufreq maximum")


def test_a_processor_without_an_fma_loop_keeps_its_reported_clock():
    for cpu in (parse(ARM), parse(cpuinfo(1, flags="sse2 sse4_2"))):
        assert running(cpu) == cpu


IMUL_CHAIN = "480fafc0" * 30 + "48ffcf7583c3"  # 1: imul rax, rax (x 30); dec rdi; jnz 1b; ret
HOST = processor()
MEASURABLE = HOST is not None and vector_width(HOST.flags) is not None and executable(b"\xc3") is not None


@pytest.mark.skipif(not MEASURABLE, reason="no x86 with AVX2 or AVX-512 here, or no executable page")
def test_this_hosts_clock_with_its_fma_units_busy_is_the_clock_its_multiplies_count(tmp_path, monkeypatch):
    """The real processor: its cores timed on FMAs, the clock their peak takes; against an
    independent clock, a chain of dependent 64-bit multiplies (3 cycles each on every x86-64 core
    since 2008, whatever its vector units): within what AVX-512's lower clock on Intel and the
    one busy core's boost allow. The best is kept per machine."""
    monkeypatch.setattr(processor_module, "CACHE", tmp_path / "cpu_clock.json")
    measured = running.__wrapped__(HOST)
    assert measured.clock == "measured, FMA units busy" and 0.5 < measured.ghz < 7
    assert measured.peak(jnp.float32) == pytest.approx(HOST.cores * measured.ghz * 1e9 * HOST.flops_per_cycle(
        jnp.float32))
    assert f"x {measured.ghz:.2f} GHz (measured, FMA units busy) x" in measured.describe(jnp.float32)
    multiplies = 30 * 3 / seconds_per_iteration(executable(bytes.fromhex(IMUL_CHAIN)), budget=0.2) / 1e9
    assert 0.7 * multiplies < measured.ghz < 1.1 * multiplies, (measured.ghz, multiplies)
    assert list(json.loads((tmp_path / "cpu_clock.json").read_text()).values()) == [measured.ghz]
    again = running.__wrapped__(HOST)  # a later process: never below the best before it
    assert again.ghz >= measured.ghz and list(json.loads((tmp_path / "cpu_clock.json").read_text()).values()) == [
        again.ghz]


@pytest.mark.skipif(not MEASURABLE, reason="no x86 with AVX2 or AVX-512 here, or no executable page")
def test_a_cpu_devices_peak_takes_the_measured_clock(tmp_path, monkeypatch):
    monkeypatch.setattr(processor_module, "CACHE", tmp_path / "cpu_clock.json")
    peak, source = peak_flops(jax.devices("cpu")[0], jnp.float32)
    host = running(HOST)
    assert peak == host.peak(jnp.float32) / len(jax.local_devices(backend="cpu"))
    assert "GHz (measured, FMA units busy) x" in source


@pytest.mark.skipif(not (shutil.which("as") and shutil.which("objcopy")), reason="no assembler (binutils)")
def test_the_machine_code_is_its_assembly(tmp_path):
    """The bytes of theseus.base.clock against GNU as's of the listing its comments give."""
    zero = {"ymm": "vxorps", "zmm": "vpxord"}
    listings = {width: [*(f"{zero[width]} {width}{i}, {width}{i}, {width}{i}" for i in (*range(12), 14, 15)), "1:",
                        *(f"vfmadd231ps {width}{i}, {width}14, {width}15" for i in range(12)), "dec rdi", "jnz 1b",
                        "vzeroupper", "ret"] for width in FMA_LOOP}
    listings["imul"] = ["1:", *["imul rax, rax"] * 30, "dec rdi", "jnz 1b", "ret"]
    for name, listing in listings.items():
        source, obj, raw = (tmp_path / f"{name}{suffix}" for suffix in (".s", ".o", ".bin"))
        source.write_text(".intel_syntax noprefix\n.text\n" + "\n".join(listing) + "\n")
        subprocess.run(["as", "--64", "-o", obj, source], check=True)
        subprocess.run(["objcopy", "-O", "binary", "-j", ".text", obj, raw], check=True)
        assert raw.read_bytes().hex() == {**FMA_LOOP, "imul": IMUL_CHAIN}[name], name
