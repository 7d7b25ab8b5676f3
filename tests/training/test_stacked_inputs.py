"""A run saved before the MLP's input projections were weights of their own (one ``w_in``
stacked on an ``n_in`` axis, gate first) resumes, starts a new run and samples with today's
theseus, to the numbers of its twin saved in today's layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from support import read_param_paths, run_python

pytestmark = pytest.mark.slow  # real runs in subprocesses

STEPS = 6


def command(corpus: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["-m", "theseus.run", "+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}",
            f"data.cache_dir={corpus.parent / 'cache'}", "trainer.max_steps=4", "trainer.log_every=1",
            "trainer.eval_every=0", "trainer.checkpoint_every=2", "optimizer.schedule=constant",
            "optimizer.warmup_steps=0", "logger.mode=disabled", f"hydra.run.dir={run_dir}", *extra]


def stacked(tree, scanned: bool = False):
    """A state tree in the layout before the change (written here, not by theseus): each MLP's
    ``w_gate``/``w_up`` (``b_...``) stacked into ``w_in`` (``b_in``) on its first axis, the second
    in scanned blocks (``h``: layers first)."""
    if isinstance(tree, (list, tuple)):
        return type(tree)(stacked(node, scanned) for node in tree)
    if not isinstance(tree, dict):
        return tree
    tree = {key: stacked(node, scanned or key == "h") for key, node in tree.items()}
    names = [name for name in ("gate", "up") if f"w_{name}" in tree]
    if not names or "w_out" not in tree:
        return tree
    for prefix in "wb":
        if f"{prefix}_{names[0]}" in tree:
            tree[f"{prefix}_in"] = np.stack([tree.pop(f"{prefix}_{name}") for name in names], axis=int(scanned))
    return tree


def restack(state_dir: Path) -> None:
    """Rewrite a checkpoint's train state in the stacked layout, with Orbax alone."""
    import jax
    import orbax.checkpoint as ocp

    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    checkpointer = ocp.StandardCheckpointer()
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
                          checkpointer.metadata(state_dir).item_metadata)
    state = jax.tree.map(np.asarray, checkpointer.restore(state_dir, target))
    shutil.rmtree(state_dir)
    checkpointer.save(state_dir, stacked(state))
    checkpointer.wait_until_finished()


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


@pytest.mark.parametrize("extra", [[], ["architecture.activation=swiglu", "architecture.scan_layers=true"]],
                         ids=["gelu", "swiglu-scanned"])
def test_a_run_saved_stacked_starts_runs_samples_and_resumes_as_today(corpus, tmp_path, extra):
    today, old = tmp_path / "today", tmp_path / "old"
    first = run_python(*command(corpus, today, *extra), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.copytree(today, old)
    for step in (old / "checkpoints").iterdir():
        if step.name.isdigit():
            restack(step / "state")
    saved = read_param_paths(old / "checkpoints" / "4" / "state")
    layer, axis = ("h", 1) if extra else ("h_0", 0)
    assert saved[f"{layer}/mlp/w_in"].shape[axis] == (2 if extra else 1)
    assert not any(path.endswith("w_up") for path in saved)

    # a new run from its weights and optimizer state, and its samples: today's twin's
    started = {name: run_python(*command(corpus, tmp_path / f"from-{name}", *extra, "trainer.max_steps=2",
                                         f"trainer.init_from={run_dir}", "trainer.init_optimizer=true"), cwd=tmp_path)
               for name, run_dir in (("today", today), ("old", old))}
    assert started["old"].returncode == 0, started["old"].stderr[-3000:]
    assert losses(tmp_path / "from-old") == losses(tmp_path / "from-today")
    replies = {name: run_python("-m", "theseus.sample", str(run_dir), "--prompt", "def ", "--max-new-tokens", "8",
                                "--temperature", "0", cwd=tmp_path) for name, run_dir in (("today", today), ("old", old))}
    assert replies["old"].returncode == 0, replies["old"].stderr[-3000:]
    assert replies["old"].stdout == replies["today"].stdout

    for run_dir in (today, old):  # resumed to step 6: the same steps, the same losses
        proc = run_python(*command(corpus, run_dir, *extra, f"trainer.max_steps={STEPS}"), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(losses(old)) == STEPS and losses(old) == losses(today)
