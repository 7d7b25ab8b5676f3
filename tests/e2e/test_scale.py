"""The scale knobs from the command line: scanned, rematerialised layers train, checkpoint,
resume and sample; trainer.profile_steps writes a trace of just those steps."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from support import ROOT, run_python

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

TINY = ["+experiment=gpt_tiny", "trainer.max_steps=4", "trainer.log_every=1", "trainer.eval_every=0",
        "trainer.eval_batches=1", "trainer.checkpoint_every=2", "trainer.batch_size=4", "logger.mode=disabled",
        "optimizer.schedule=constant", "optimizer.warmup_steps=2"]  # constant: max_steps may grow on resume


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text((ROOT / "theseus" / "training" / "trainer.py").read_text() * 2)
    return ["data.source=text", f"data.path={path}", f"data.cache_dir={path.parent / 'cache'}",
            "data.tokenizer=byte"]


def traces(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "profile").glob("plugins/profile/*/*.xplane.pb"))


def events(trace: Path) -> Counter:
    """The names of a trace's complete events, counted (``*.trace.json.gz`` beside the xplane)."""
    path = trace.parent / trace.name.replace("xplane.pb", "trace.json.gz")
    return Counter(e["name"] for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X")


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def test_scanned_remat_run_trains_resumes_samples_and_profiles_only_the_chosen_steps(corpus, tmp_path):
    run_dir = tmp_path / "run"
    knobs = ["architecture.scan_layers=true", "architecture.remat=dots", f"hydra.run.dir={run_dir}"]
    proc = run_python("-m", "theseus.run", *TINY, *corpus, *knobs, "trainer.profile_steps=[2,3]", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(losses(run_dir)) == 4 and len(traces(run_dir)) == 1
    # the two steps' executions, and no Python call (JAX's Python tracer, off: theseus.training.profiler)
    traced = events(traces(run_dir)[0])
    assert traced["CommonPjRtLoadedExecutable::Execute (jit_train_step)"] == 2
    assert not [name for name in traced if name.startswith("$")], traced.most_common(5)

    # resumed to step 6 with remat off (the same numbers): no trace outside [2, 3]
    proc = run_python("-m", "theseus.run", *TINY, *corpus, *knobs[:1], f"hydra.run.dir={run_dir}",
                      "trainer.max_steps=6", "trainer.profile_steps=[2,3]", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(losses(run_dir)) == 6 and len(traces(run_dir)) == 1
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir())[-1] == "6"

    proc = run_python("-m", "theseus.sample", str(run_dir), "--prompt", "def ", "--max-new-tokens", "8",
                      "--temperature", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("def ") and len(proc.stdout) > len("def ")
