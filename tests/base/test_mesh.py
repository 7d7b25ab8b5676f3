"""mesh.cpu_devices: JAX's CPU backend made of N devices, in a fresh process (it starts once)."""

from __future__ import annotations

import pytest
from support import run_python

from theseus.base.mesh import MeshConfig
from theseus.config import ConfigError

CPU = ": on a CPU, it sets how many devices there are (the host's cores split among them)"


@pytest.mark.parametrize("mesh, sizable, message", [
    (MeshConfig(tensor=3), True, "mesh data=-1 x fsdp=1 x expert=1 x tensor=3 does not divide the 1 device: fix "
                                 "mesh.* so the product is 1, or set mesh.cpu_devices=3" + CPU),
    (MeshConfig(data=2, tensor=2), True, "mesh data=2 x fsdp=1 x expert=1 x tensor=2 needs 4 devices but 1 are "
                                         "present: set mesh.data/fsdp/tensor so their product is 1 (-1 takes the "
                                         "rest), or set mesh.cpu_devices=4" + CPU),
    (MeshConfig(tensor=3), False, "mesh data=-1 x fsdp=1 x expert=1 x tensor=3 does not divide the 1 device: fix "
                                  "mesh.* so the product is 1"),  # an accelerator's: their count is the machine's
])
def test_a_mesh_the_devices_cannot_hold_says_how_to_make_more_cpu_devices(mesh, sizable, message):
    with pytest.raises(ConfigError) as error:
        mesh.shape(1, sizable)
    assert str(error.value) == message

SCRIPT = r"""
import sys
import jax
from theseus.base.mesh import MeshConfig, compiler_options, use_cpu_devices
from theseus.config import ConfigError

if sys.argv[1] == "fresh":
    use_cpu_devices(3)
    print(len(jax.devices()), compiler_options(jax.devices()))
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
    assert lines[0] == "3 {'xla_cpu_multi_thread_eigen': False}"
    assert lines[1].startswith("mesh.cpu_devices=5, but JAX's CPU backend has started with 3 devices")
    flagged = run_python("-c", SCRIPT, "flagged", devices=2)
    assert flagged.returncode == 0, flagged.stderr[-2000:]
    assert flagged.stdout.splitlines()[0] == "2"
    assert "has started with 2 devices" in flagged.stdout.splitlines()[1]


AUTO = r"""
import os, sys, tempfile
import jax
from theseus.base.mesh import MeshConfig, auto_cpu_devices
from theseus.config.compose import compose
from theseus.recipe import assemble, resolve

print(auto_cpu_devices(MeshConfig(), 12, cores=4), auto_cpu_devices(MeshConfig(), 6, cores=4),
      auto_cpu_devices(MeshConfig(), 7, cores=4), auto_cpu_devices(MeshConfig(data=1), 12, cores=4),
      auto_cpu_devices(MeshConfig(fsdp=2), 12, cores=4), auto_cpu_devices(MeshConfig(cpu_devices=1), 12, cores=4))
assemble(resolve(compose(["+experiment=gpt_tiny", "data.source=text", f"data.path={sys.argv[1]}",
                           f"data.cache_dir={tempfile.mkdtemp()}", "trainer.batch_size=12", "logger.mode=disabled"])),
         steps=None)
from theseus.base.processor import processor
print(jax.device_count(), processor().cores if processor() else len(os.sched_getaffinity(0)))  # physical cores
"""


@pytest.mark.slow
def test_a_cpu_run_gets_a_device_per_core_when_nothing_chose_a_count(corpus):
    """Unset mesh.cpu_devices on a data-parallel mesh: the most devices, one per physical core at
    most, that split the micro-batch; any mesh size, count or XLA flag given leaves the choice to it."""
    proc = run_python("-c", AUTO, str(corpus))
    assert proc.returncode == 0, proc.stderr[-2000:]
    choices, made = proc.stdout.splitlines()[-2:]
    assert choices == "4 3 1 None None None"
    devices, cores = map(int, made.split())
    assert devices == max(n for n in range(1, cores + 1) if 12 % n == 0)
    flagged = run_python("-c", AUTO, str(corpus), devices=3)  # XLA_FLAGS' count stands
    assert flagged.returncode == 0, flagged.stderr[-2000:]
    assert flagged.stdout.splitlines()[-1].split()[0] == "3"
