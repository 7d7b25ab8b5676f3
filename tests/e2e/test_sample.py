"""``python -m theseus.sample`` on a freshly trained run: any temperature, any length (past the
context too), errors in one line."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pytest

from support import ROOT, run_python

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses


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
    """An untrained model spreads its probability over the padded ids too: none may come out. Nor
    may the bytes it draws reach the terminal as they are: NUL, escapes, bytes that are no UTF-8
    character's come out as a visible ``\\xNN``."""
    for seed in ("0", "1"):
        proc = run_python("-m", "theseus.sample", str(run_dir), "--temperature", "1", "--max-new-tokens", "60",
                          "--seed", seed)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert len(proc.stdout) > 1
        assert re.search(r"\\x[0-9a-f]{2}", proc.stdout), proc.stdout  # drawn among the 257 ids, some are
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffd]", proc.stdout), proc.stdout


def test_a_bad_sampling_argument_is_one_line(run_dir):
    proc = run_python("-m", "theseus.sample", str(run_dir), "--top-k", "1000", "--max-new-tokens", "20")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "theseus: error: top_k must be between 1 and the vocabulary size (257), got 1000")


@pytest.mark.slow
def test_the_readme_s_200_tokens_past_a_64_token_context(run_dir):
    """The README's command (greedy): 200 tokens from gpt_tiny (seq_len 64), each the argmax of
    a full forward pass over the last 64 tokens, as nanoGPT samples."""
    from theseus.cli.trained import load_trained

    proc = run_python("-m", "theseus.sample", str(run_dir), "--prompt", "def ", "--max-new-tokens", "200",
                      "--temperature", "0")
    assert proc.returncode == 0, proc.stderr[-2000:]

    run = load_trained(run_dir)
    model, tokenizer = run.model, run.tokenizer
    assert model.seq_len == 64
    logits = jax.jit(lambda window: run.model.apply({"params": run.params}, window))
    tokens = list(tokenizer.encode("def "))
    for _ in range(200):
        window = tokens[-64:]  # padded to 64 at its end: causality keeps the padding from its last position
        scores = np.asarray(logits(np.asarray([window + [0] * (64 - len(window))], np.int32)))
        tokens.append(int(scores[0, len(window) - 1, :tokenizer.vocab_size].argmax()))
    assert proc.stdout == "def " + tokenizer.printable(tokens[-200:]) + "\n"
