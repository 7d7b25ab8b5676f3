"""The trainer on real meshes: 8 simulated CPU devices in a subprocess, against 1 device."""

from __future__ import annotations

import json
import sys

import pytest

from support import run_python

SCRIPT = r"""
import json, sys, tempfile
from pathlib import Path
import jax
from theseus.config.compose import compose
from theseus.training.trainer import Trainer
from theseus.training.state import bytes_per_device

corpus, meshes = sys.argv[1], json.loads(sys.argv[2])
base = ["+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}", f"data.cache_dir={tempfile.mkdtemp()}",
        "trainer.max_steps=10", "trainer.log_every=1", "trainer.eval_every=0", "trainer.eval_batches=1",
        "logger.mode=disabled", "optimizer.warmup_steps=2"]
out = {}
for name, overrides in meshes.items():
    run_dir = Path(tempfile.mkdtemp())
    trainer = Trainer(compose(base + overrides))
    trainer.run(run_dir)
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out[name] = [l["loss"] for l in lines if "loss" in l]
print("RESULT" + json.dumps(out))
"""


def losses(corpus, meshes: dict[str, list[str]], devices: int) -> dict[str, list[float]]:
    proc = run_python("-c", SCRIPT, str(corpus), json.dumps(meshes), devices=devices)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("".join(open(m.__file__).read() for m in (json, pytest) if m.__file__))
    return path


def test_meshes_reproduce_single_device_losses(corpus):
    single = losses(corpus, {"one": ["mesh.data=1"]}, devices=1)["one"]
    meshes = {"data8": ["mesh.data=8"], "fsdp8": ["mesh.data=1", "mesh.fsdp=8"],
              "tensor2_data4": ["mesh.data=4", "mesh.tensor=2"], "fsdp4_tensor2": ["mesh.data=1", "mesh.fsdp=4", "mesh.tensor=2"]}
    multi = losses(corpus, meshes, devices=8)
    assert len(single) == 10 and single[-1] < single[0]
    for name, values in multi.items():
        assert values == pytest.approx(single, rel=1e-5), name
