"""A LoRA run from a Hugging Face folder: its checkpoints hold the adapters and their optimizer
state alone and name their base; resume rebuilds base + adapters bit for bit; a changed or
missing base is refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from interop.test_cli import train_args
from safetensors.numpy import load_file, save_file
from support import run_python

pytestmark = pytest.mark.slow  # real runs in subprocesses


def saved_state(step_dir: Path) -> dict[str, np.ndarray]:
    """Every array of a checkpoint's train state by its path, read back with Orbax alone."""
    reader, one = ocp.StandardCheckpointer(), jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
                          reader.metadata((step_dir / "state").absolute()).item_metadata)
    state = reader.restore((step_dir / "state").absolute(), target)
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(state)}


def lora(base: Path, tmp: Path, run: str, *extra: str) -> list[str]:
    """4 LoRA steps (weight decay on, dropout on the adapters) saving at 2 and 4, into tmp/run."""
    return [*(arg for arg in train_args(base, tmp, "architecture.lora.rank=4", "architecture.lora.dropout=0.1",
                                        "architecture.lora.targets=[q,v,down]", "optimizer.weight_decay=0.5",
                                        "optimizer.warmup_steps=0", "trainer.max_steps=4",
                                        "trainer.checkpoint_every=2", *extra)
              if arg != "trainer.max_steps=2" and not arg.startswith("hydra.run.dir")), f"hydra.run.dir={tmp / run}"]


def test_lora_checkpoints_hold_the_adapters_and_resume_on_their_base(llama_folder, tmp_path):
    base = shutil.copytree(llama_folder, tmp_path / "base")
    proc = run_python(*lora(base, tmp_path, "straight"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    straight = tmp_path / "straight" / "checkpoints"
    state = saved_state(straight / "4")
    params = [path for path in state if path.startswith("['params']")]
    assert params and all("'lora_" in path for path in params), params  # the adapters alone ...
    assert (straight / "4" / "base").is_dir()  # ... and the base's record
    held = sum(value.nbytes for value in state.values())  # adapters, their moments, counters
    assert held < (base / "model.safetensors").stat().st_size / 10, held

    proc = run_python(*lora(base, tmp_path, "resumed", f"trainer.resume={straight / '2'}"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {straight / '2'} at step 2" in proc.stdout + proc.stderr
    resumed = saved_state(tmp_path / "resumed" / "checkpoints" / "4")
    assert resumed.keys() == state.keys()
    for path, value in state.items():  # params and optimizer state, bit for bit
        assert resumed[path].tobytes() == value.tobytes(), path

    tensors = load_file(str(base / "model.safetensors"))  # the base changes under the run
    name = next(name for name in tensors if name.endswith("k_proj.weight"))
    save_file({**tensors, name: tensors[name] * 2}, str(base / "model.safetensors"), metadata={"format": "pt"})
    proc = run_python("-m", "theseus.export", str(tmp_path / "straight"), str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"theseus: error: checkpoint {straight / '4'} holds LoRA adapters trained on the base {base}, but the weights "
        f"in {base} are not that base's: put back the weights the run started from (or start a new run from these, "
        f"in a new hydra.run.dir)")
    assert not (tmp_path / "out").exists()

    base.rename(tmp_path / "moved")
    for command in (["theseus.export", str(tmp_path / "straight"), str(tmp_path / "out")],
                    ["theseus.run", *lora(base, tmp_path, "straight")[2:]]):
        proc = run_python("-m", *command, cwd=tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.strip() == (
            f"theseus: error: {straight / '4'} holds LoRA adapters without their base, {base}, which is not there: put the "
            f"base folder back at {base}")
    assert not (tmp_path / "out").exists()

    proc = run_python(*train_args(tmp_path / "straight", tmp_path), cwd=tmp_path)  # a run from its adapters alone
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"theseus: error: trainer.init_from={tmp_path / 'straight'} holds LoRA adapters "
                                   f"without their base: export it merged (python -m theseus.export "
                                   f"{tmp_path / 'straight'} OUT) and start from OUT")
