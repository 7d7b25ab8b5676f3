"""Mixture of experts in training: expert-parallel meshes of 8 CPU devices reproduce one device
(losses and drops), compile to all-to-alls, FLOPs agree with XLA's, and ``moe_small`` logs
its routing."""

from __future__ import annotations

import json
import math

import pytest

from support import run_python
from theseus.config.compose import compose
from theseus.recipe import assemble, resolve

SCRIPT = r"""
import json, math, re, sys, tempfile
from pathlib import Path
import jax
from theseus.config.compose import compose
from theseus.recipe import assemble, resolve
from theseus.training.trainer import Trainer

corpus, runs = sys.argv[1], json.loads(sys.argv[2])
base = ["+experiment=gpt_tiny", "model=moe", "data.source=text", f"data.path={corpus}",
        f"data.cache_dir={tempfile.mkdtemp()}", "architecture.d_model=32", "architecture.seq_len=32",
        "architecture.moe.n_experts=4", "trainer.batch_size=8", "trainer.max_steps=4", "trainer.log_every=1",
        "trainer.eval_every=0", "trainer.eval_batches=1", "logger.mode=disabled", "optimizer.warmup_steps=2"]
out = {}
for name, overrides in runs.items():
    run_dir = Path(tempfile.mkdtemp())
    run = assemble(resolve(compose(base + overrides), run_dir))
    compiled = run.compiled
    text = compiled.step.as_text()
    gathered = [math.prod(int(d) for d in dims.split(",") if d)
                for result in re.findall(r"= (\(.*?\)|\S+) all-gather(?:-start)?\(", text)
                for dims in re.findall(r"\[([\d,]*)\]", result)]
    out["devices"] = jax.device_count()  # once the trainer has made the backend (mesh.cpu_devices)
    Trainer(run).run(run_dir)
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out[name] = {"loss": [l["loss"] for l in lines if "loss" in l], "dropped": [l["moe/dropped"] for l in lines if "loss" in l],
                 "all_to_all": len(re.findall(r" all-to-all(?:-start)?\(", text)), "gathered": gathered,
                 "largest_param": max(math.prod(p.shape) for p in jax.tree.leaves(compiled.target.params))}
print("RESULT" + json.dumps(out))
"""

NO_DROPS = "architecture.moe.capacity_factor=2.0"  # 2 x seq x top_k / n_experts = seq: every choice fits
DROPS = "architecture.moe.capacity_factor=0.5"


def train(corpus, runs: dict[str, list[str]]) -> dict:
    proc = run_python("-c", SCRIPT, str(corpus), json.dumps(runs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Involuntary full rematerialization" not in proc.stderr
    return json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))[len("RESULT"):])


@pytest.mark.slow
def test_expert_parallel_meshes_reproduce_one_device(corpus):
    single = train(corpus, {"none": [NO_DROPS, "mesh.cpu_devices=1"], "drops": [DROPS, "mesh.cpu_devices=1"]})
    assert single["devices"] == 1
    meshes = {"expert4_data2": ["mesh.data=2", "mesh.expert=4"],
              "expert2_fsdp2_tensor2": ["mesh.data=1", "mesh.expert=2", "mesh.fsdp=2", "mesh.tensor=2"]}
    runs = {f"{name}_none": [*mesh, NO_DROPS, "mesh.cpu_devices=8"] for name, mesh in meshes.items()}
    runs["expert4_data2_drops"] = [*meshes["expert4_data2"], DROPS, "mesh.cpu_devices=8"]
    multi = train(corpus, runs)
    assert multi["devices"] == 8
    assert single["none"]["dropped"] == [0.0] * 4 and min(single["drops"]["dropped"]) > 0.1
    assert single["none"]["loss"][-1] < single["none"]["loss"][0]
    for name, result in multi.items():
        if name == "devices":
            continue
        reference = single[name.rsplit("_", 1)[1]]
        assert result["loss"] == pytest.approx(reference["loss"], rel=1e-5), name
        assert result["dropped"] == pytest.approx(reference["dropped"], abs=1e-7), name
        # tokens to their experts and back, forward and backward, in each of gpt_tiny's 2 layers
        assert result["all_to_all"] == 8, name
        assert max(result["gathered"], default=0) <= result["largest_param"], name  # weights only (FSDP)
    assert multi["expert4_data2_none"]["gathered"] == []  # nothing split but the batch and the experts
    assert single["none"]["all_to_all"] == 0


@pytest.mark.slow
def test_flops_agree_with_xla(corpus, tmp_path):
    """Capacity 1: the experts' slots are exactly the top_k choices (2 x 64 / 4 = 32 each), so
    XLA computes what ``flops`` counts; the dense model for comparison."""
    base = ["+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}", f"data.cache_dir={tmp_path}",
            "architecture.d_model=256", "architecture.seq_len=64", "trainer.batch_size=4", "trainer.grad_accum=1"]
    ratios = {}
    for name, extra in {"dense": [], "moe": ["model=moe", "architecture.moe.n_experts=4",
                                             "architecture.moe.capacity_factor=1.0"]}.items():
        run = assemble(resolve(compose(base + extra)))
        ratios[name] = run.compiled.xla_flops / run.flops_per_step
    assert ratios["moe"] == pytest.approx(1.0, abs=0.05), ratios
    assert ratios["moe"] == pytest.approx(ratios["dense"], abs=0.05), ratios


@pytest.mark.slow
def test_moe_small_logs_each_experts_load(corpus, tmp_path):
    """The README's command, on an expert-parallel mesh of 2 CPU devices, two steps, two of its
    layers and shorter sequences (what is logged does not depend on them), with bias-balanced
    routing: its biases are logged, zero at the first step, then each moved by the rate (their
    mean over layers within it)."""
    proc = run_python("-m", "theseus.run", "+experiment=moe_small", "mesh.expert=2", "mesh.cpu_devices=2",
                      "architecture.n_layers=2", "architecture.seq_len=64",
                      "data.source=text", f"data.path={corpus}", "data.val_fraction=0.2", "trainer.max_steps=2",
                      "trainer.log_every=1", "trainer.eval_every=0", "trainer.eval_batches=1", "logger.mode=disabled",
                      "architecture.moe.bias_update_rate=0.001", "hydra.run.dir=run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [line for line in lines if "loss" in line]
    assert len(logged) == 2
    for line in logged:
        loads = [line[f"moe/load_e{i}"] for i in range(8)]
        assert sum(loads) == pytest.approx(1.0, abs=1e-5) and min(loads) >= 0
        assert 0 <= line["moe/dropped"] < 1 and line["moe/aux_loss"] > 0 and line["moe/z_loss"] > 0
        assert line["loss"] > line["lm_loss"] and math.isfinite(line["mfu"])
    biases = [[line[f"moe/bias_e{i}"] for i in range(8)] for line in logged]
    assert biases[0] == [0.0] * 8
    assert all(abs(b) <= 0.001 * (1 + 1e-6) for b in biases[1]) and any(b != 0 for b in biases[1])
