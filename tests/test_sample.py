"""``python -m theseus.sample`` on a freshly trained run: any temperature, errors in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import ROOT, run_python


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A 5-step gpt_tiny run on a byte-tokenized corpus (257 ids, padded to 384 in the model)."""
    base = tmp_path_factory.mktemp("sample")
    corpus = base / "corpus.txt"
    corpus.write_text((ROOT / "theseus" / "model" / "generate.py").read_text() * 8)
    proc = run_python("-m", "theseus.run", "+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}",
                      f"data.cache_dir={base / 'cache'}", "trainer.max_steps=5", "trainer.checkpoint_every=5",
                      "trainer.eval_every=0", "logger.mode=disabled", f"hydra.run.dir={base / 'run'}", cwd=base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base / "run"


def test_sampling_at_temperature_one_after_five_steps(run_dir):
    """An untrained model spreads its probability over the padded ids too: none may come out."""
    for seed in ("0", "1"):
        proc = run_python("-m", "theseus.sample", str(run_dir), "--temperature", "1", "--max-new-tokens", "60",
                          "--seed", seed)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert len(proc.stdout) > 1


def test_a_bad_sampling_argument_is_one_line(run_dir):
    proc = run_python("-m", "theseus.sample", str(run_dir), "--top-k", "1000", "--max-new-tokens", "20")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "theseus: error: top_k must be between 1 and the vocabulary size (257), got 1000")
