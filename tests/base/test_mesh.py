"""mesh.cpu_devices: JAX's CPU backend made of N devices, in a fresh process (it starts once)."""

from __future__ import annotations

import pytest
from support import run_python

SCRIPT = r"""
import sys
import jax
from theseus.base.mesh import MeshConfig, compiler_options, use_cpu_devices
from theseus.config import ConfigError

if sys.argv[1] == "fresh":
    use_cpu_devices(3)
    print(len(jax.devices()), compiler_options(MeshConfig(cpu_devices=3)), compiler_options(MeshConfig()))
    use_cpu_devices(3)  # the same again: nothing to change
else:  # started by XLA_FLAGS' two devices before any mesh.cpu_devices
    print(len(jax.devices()))
    use_cpu_devices(2)  # what the backend has: accepted
try:
    use_cpu_devices(5)
except ConfigError as exc:
    print(exc)
"""


@pytest.mark.slow
def test_cpu_devices_make_the_backend_once_and_a_later_count_is_refused():
    fresh = run_python("-c", SCRIPT, "fresh")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    lines = fresh.stdout.splitlines()
    assert lines[0] == "3 {'xla_cpu_multi_thread_eigen': False} {}"
    assert lines[1].startswith("mesh.cpu_devices=5, but JAX's CPU backend has started with 3 devices")
    flagged = run_python("-c", SCRIPT, "flagged", devices=2)
    assert flagged.returncode == 0, flagged.stderr[-2000:]
    assert flagged.stdout.splitlines()[0] == "2"
    assert "has started with 2 devices" in flagged.stdout.splitlines()[1]
