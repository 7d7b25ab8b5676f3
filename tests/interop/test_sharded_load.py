"""A checkpoint loads straight onto its shards: 8 simulated devices, FSDP over all of them; or,
replicated, into one host copy that every CPU device reads."""

from __future__ import annotations

import json
import textwrap

from support import ROOT, run_python

SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import jax, numpy as np, optax
    from theseus.base.mesh import MeshConfig, make_mesh
    from theseus.config import configuration, configure
    from theseus.interop.hf_config import arch_of, architecture, read_config
    from flax import traverse_util
    from theseus.interop.hf_weights import Checkpoint, to_theseus
    from theseus.sources.weights import load_params
    from theseus.model.models.gpt import GPT
    from theseus.training.state import sharded_init

    folder = Path(sys.argv[1])
    arch = architecture(read_config(folder))
    with configuration({f"architecture.{k}": v for k, v in arch.items()}):
        model = configure(GPT)
    mesh_config = MeshConfig(data=int(sys.argv[2]), fsdp=int(sys.argv[3]))
    mesh, plan = make_mesh(mesh_config), mesh_config.apply(model.plan())
    _, target, _ = sharded_init(model, optax.sgd(0.1), 8, 0, plan, mesh)
    params = load_params(folder, arch_of(model), target.params)
    with Checkpoint(folder) as ckpt:
        full = {path: thunk() for path, thunk in to_theseus("llama", arch_of(model), ckpt.read).items()}
    report = {}
    leaves = traverse_util.flatten_dict(target.params, sep="/")
    for path, array in traverse_util.flatten_dict(params, sep="/").items():
        leaf = leaves[path]
        shards = array.addressable_shards
        report[path] = {
            "sharding_equal": array.sharding == leaf.sharding,
            "shapes": sorted({tuple(s.data.shape) for s in shards}),
            "expected": list(leaf.sharding.shard_shape(leaf.shape)),
            "full": list(leaf.shape),
            "devices": len({s.device for s in shards}),
            "values_equal": all(np.array_equal(np.asarray(s.data), full[path][s.index]) for s in shards),
            "buffers": len({s.data.unsafe_buffer_pointer() for s in shards}),
        }
    # a step that donates the params writes its own buffers, never the copy the devices share
    doubled = jax.jit(lambda p: jax.tree.map(lambda a: a * 2, p), donate_argnums=0)(params)
    for path, array in traverse_util.flatten_dict(doubled, sep="/").items():
        report[path]["donated_step_right"] = all(np.array_equal(np.asarray(s.data), 2 * full[path][s.index])
                                                 for s in array.addressable_shards)
    print(json.dumps(report))
""")


def load_report(folder, tmp_path, data: int, fsdp: int) -> dict:
    """SCRIPT's report of ``folder`` loaded on ``data x fsdp`` CPU devices: a parameter's entry each."""
    script = tmp_path / "load.py"
    script.write_text(SCRIPT)
    proc = run_python(str(script), str(folder), str(data), str(fsdp), devices=data * fsdp,
                      env={"PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert len(report) == 2 * 9 + 3  # 9 tensors a layer, embedding, final norm, untied head
    return report


def test_each_tensor_lands_on_its_fsdp_shards(llama_sharded_folder, tmp_path):
    """From a checkpoint in several safetensors files (with their index), as big ones are saved."""
    assert len(list(llama_sharded_folder.glob("model-*.safetensors"))) > 1
    report = load_report(llama_sharded_folder, tmp_path, 1, 8)
    for path, r in report.items():
        assert r["sharding_equal"] and r["values_equal"] and r["donated_step_right"] and r["devices"] == 8, path
        assert r["shapes"] == [r["expected"]], path  # every device holds exactly its slice
    # embed (64) splits 8 ways over fsdp: each device holds an eighth of the embedding and of wq
    assert report["wte/embedding"]["expected"] == [333, 8]
    assert report["h_0/attn/wq"]["expected"] == [8, 4, 16]
    assert report["lm_head"]["expected"] == [8, 333]


def test_a_replicated_parameter_is_one_host_copy_every_cpu_device_reads(llama_folder, tmp_path):
    """Two CPU devices, the batch split over them, the parameters whole on each: each parameter
    is copied once from the file and both devices read that copy (one buffer), its values the
    checkpoint's; a step that donates them computes right and leaves the copy alone."""
    for path, r in load_report(llama_folder, tmp_path, 2, 1).items():
        assert r["values_equal"] and r["donated_step_right"] and r["devices"] == 2, path
        assert r["shapes"] == [r["full"]] and r["buffers"] == 1, path
