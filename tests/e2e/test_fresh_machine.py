"""Every command prints only its own lines on a machine as a fresh install leaves it: the plan
extra's real plugins installed (libtpu, JAX's CUDA plugin), no CUDA libraries, no accelerator,
and no ``JAX_PLATFORMS`` (which every other test sets for its subprocesses).

A bare ``import jax`` there starts the CUDA plugin, whose version check fails in a traceback
(``Unable to load CUDA. Is it installed?``): the control below proves this machine is such a
one, so that a quiet command means theseus chose its platforms, not that the plugin had
nothing to say.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is None or importlib.util.find_spec("libtpu") is None,
                       reason="the plan extra's plugins (libtpu, jax-cuda12-plugin) are not installed"),
]

# what the plugins say on a machine without their hardware, and any traceback
NOISE = re.compile(r"Unable to load CUDA|plugin configuration error|cudart_stub|absl::InitializeLog|TPU_WORKER|"
                   r"host bounds|Source Location Trace|Traceback")


def fresh(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python ARGS`` as a fresh machine runs it: no ``JAX_PLATFORMS`` in the environment."""
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A user's folder: a corpus, and a 2-step gpt_tiny run on it (``run/``), trained quietly."""
    base = tmp_path_factory.mktemp("fresh")
    control = fresh("-c", "import jax; jax.devices()", cwd=base)
    if "Unable to load CUDA" not in control.stderr:
        pytest.skip("this machine has CUDA libraries or a GPU: the CUDA plugin has nothing to complain of")
    (base / "corpus.txt").write_text(Path(re.__file__).read_text() * 2)
    proc = fresh("-m", "theseus.run", "+experiment=gpt_tiny", "data.source=text", "data.path=corpus.txt",
                 "data.cache_dir=cache", "trainer.max_steps=2", "trainer.batch_size=4", "trainer.checkpoint_every=2",
                 "trainer.eval_every=0", "logger.mode=disabled", "hydra.run.dir=run", cwd=base)
    assert proc.returncode == 0 and not NOISE.search(proc.stderr), proc.stderr
    return base


COMMANDS = {
    "sample": ["-m", "theseus.sample", "run", "--max-new-tokens", "4"],
    "evaluate": ["-m", "theseus.evaluate", "run"],
    "export": ["-m", "theseus.export", "run", "exported"],
    "report": ["-m", "theseus.report", "run", "-o", "report.html"],
    "config": ["-m", "theseus.config", "+experiment=gpt_tiny"],
    "prepare": ["-m", "theseus.data.prepare", "data.source=text", "data.path=corpus.txt", "data.cache_dir=cache"],
    "launch": ["-m", "theseus.launch", "--processes", "1", "--", "+experiment=gpt_tiny", "trainer.max_steps=1",
               "trainer.batch_size=4", "trainer.eval_every=0", "logger.mode=disabled", "hydra.run.dir=launched"],
    "theseus command": ["-m", "theseus", "sample", "run", "--max-new-tokens", "4"],
    "import theseus": ["-c", "import theseus, jax; print(jax.devices()[0].platform)"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_on_a_fresh_machine_prints_only_its_own_lines(folder, command):
    proc = fresh(*COMMANDS[command], cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not NOISE.search(proc.stderr), proc.stderr
