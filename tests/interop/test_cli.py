"""trainer.init_from, theseus.export and theseus.sample as a user meets them: from the command
line, in a folder outside the checkout."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from omegaconf import OmegaConf
from interop.hf_models import CORPUS, hf_logits, hf_val_loss, torch, transformers

from support import run_python

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses


def train_args(folder: Path, tmp: Path, *extra: str) -> list[str]:
    corpus = tmp / "mine.txt"
    corpus.write_text(CORPUS.read_text() * 2)
    return ["-m", "theseus.run", f"trainer.init_from={folder}", "data.source=text", f"data.path={corpus}",
            f"data.cache_dir={tmp / 'cache'}", "data.val_fraction=0.1", "trainer.max_steps=2",
            "trainer.batch_size=2", "trainer.eval_batches=1", "trainer.log_every=1", "architecture.seq_len=32",
            "logger.mode=disabled", f"hydra.run.dir={tmp / 'run'}", *extra]


@pytest.mark.parametrize(("override", "message"), [
    ("architecture.n_layers=3", "architecture.n_layers=3 contradicts trainer.init_from={folder}, whose config "
                                "gives architecture.n_layers=2: drop the override (the architecture follows the "
                                "checkpoint)"),
    ("architecture.seq_len=128", "architecture.seq_len=128 contradicts trainer.init_from={folder}, whose config "
                                 "gives architecture.seq_len=64: drop the override (the architecture follows the "
                                 "checkpoint)"),
])
def test_a_conflicting_key_fails_in_one_line_and_writes_nothing(llama_folder, tmp_path, override, message):
    args = [a for a in train_args(llama_folder, tmp_path, override) if a != "architecture.seq_len=32"]
    proc = run_python(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "theseus: error: " + message.format(folder=llama_folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]  # no run, no prepared data


def test_a_mixtral_folder_trains_as_model_moe_unless_another_model_is_given(mixtral_folder, tmp_path):
    """No model= on the command line: the folder's (moe); model=gpt given: refused in one line."""
    for side in "ab":
        (tmp_path / side).mkdir()
    proc = run_python(*train_args(mixtral_folder, tmp_path / "a"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"starting from the weights of {mixtral_folder}" in proc.stderr
    run = tmp_path / "a" / "run"
    assert OmegaConf.load(run / ".hydra" / "config.yaml").choices.model == "moe"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [sum(m[f"moe/load_e{i}"] for i in range(4)) for m in logged if "loss" in m] == pytest.approx([1.0, 1.0])

    proc = run_python(*train_args(mixtral_folder, tmp_path / "b", "model=gpt"), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"theseus: error: trainer.init_from={mixtral_folder} is a Hugging Face mixtral "
                                   f"model, which loads into model=moe, but model=gpt: set model=moe")
    assert not (tmp_path / "b" / "run").exists()


def test_a_run_from_weights_evaluates_them_at_step_0(llama_folder, tmp_path):
    """The baseline of a fine-tune: the curve's first val_loss is the folder's own, before any
    step (transformers' loss on the same validation batches), then one at the end."""
    proc = run_python(*train_args(llama_folder, tmp_path, "optimizer.lr=1e-2"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluations = [(m["step"], m["val_loss"]) for m in logged if "val_loss" in m]
    assert [step for step, _ in evaluations] == [0, 2]
    data = [a for a in train_args(llama_folder, tmp_path) if a.startswith("data.")]
    assert evaluations[0][1] == pytest.approx(hf_val_loss(llama_folder, data, 32, 2, 1), rel=1e-4)
    assert evaluations[1][1] != pytest.approx(evaluations[0][1], rel=1e-4)  # trained: another model


def test_fine_tune_export_reload_and_sample(llama_folder, tmp_path, umask_022):
    """A user's whole path: fine-tune a Llama checkpoint on their text for 2 steps (dropout set,
    context lowered), with scanned layers (loaded stacked, exported unstacked; the unrolled load
    is test_parity's), export it, load it in transformers, and sample it with its tokenizer."""
    proc = run_python(*train_args(llama_folder, tmp_path, "architecture.dropout=0.1", "optimizer.lr=1e-2",
                                  "architecture.scan_layers=true"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"starting from the weights of {llama_folder}" in proc.stderr
    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2]

    out = tmp_path / "exported"
    proc = run_python("-m", "theseus.export", str(run), str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                         "tokenizer_config.json"]
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == dict.fromkeys(
        ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"], "0o644")  # a team reads them
    assert (out / "tokenizer.json").read_text() == (llama_folder / "tokenizer.json").read_text()
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["num_key_value_heads"]) == ("llama", 333, 2)
    assert (config["max_position_embeddings"], config["rope_theta"], config["tie_word_embeddings"]) == \
        (64, 500000.0, False)  # the base's context, not the fine-tune's lowered architecture.seq_len
    base = json.loads((llama_folder / "config.json").read_text())
    assert {key: config[key] for key in base} == base  # every field of the base's config.json kept

    from theseus.cli.trained import load_trained

    restored = load_trained(run)
    model, params, tokenizer = restored.model, restored.params, restored.tokenizer
    assert model.vocab_size == 333 and model.n_kv_heads == 2 and model.rope_theta == 500000.0
    tokens = np.random.default_rng(0).integers(0, 333, size=(2, 32))
    ours = np.asarray(model.clone(dropout=0.0).apply({"params": params}, jnp.asarray(tokens)))
    reference = hf_logits(out, tokens)
    original = hf_logits(llama_folder, tokens)
    assert np.abs(reference - original).max() > 1e-3  # the two steps changed the weights ...
    assert np.corrcoef(reference.ravel(), original.ravel())[0, 1] > 0.9  # ... starting from the checkpoint's
    np.testing.assert_allclose(ours, reference, atol=1e-4, rtol=0)

    prompt = "def __init__"
    proc = run_python("-m", "theseus.sample", str(run), "--prompt", prompt, "--max-new-tokens", "8",
                      "--temperature", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
        greedy = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8,
                             min_new_tokens=8, pad_token_id=0)[0, ids.shape[1]:].tolist()
    assert proc.stdout == prompt + tokenizer.decode(greedy) + "\n"


def test_a_native_run_exports_as_gpt2_without_its_vocabulary_padding(tmp_path):
    """gpt_tiny with a 300-token BPE trains on a vocabulary padded to 384; the export has 300."""
    corpus = tmp_path / "mine.txt"
    corpus.write_text(CORPUS.read_text() * 2)
    run = tmp_path / "run"
    proc = run_python("-m", "theseus.run", "+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}",
                      "data.tokenizer=bpe", "data.bpe_vocab_size=300", f"data.cache_dir={tmp_path / 'cache'}",
                      "data.val_fraction=0.1", "trainer.max_steps=2", "trainer.batch_size=2",
                      "trainer.eval_batches=1", "logger.mode=disabled", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "exported"
    proc = run_python("-m", "theseus.export", str(run), str(out), "--step", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["n_positions"]) == ("gpt2", 300, 64)

    from theseus.cli.trained import load_trained

    restored = load_trained(run)
    model, params, tokenizer = restored.model, restored.params, restored.tokenizer
    assert model.vocab_size == 384 and tokenizer.vocab_size == 300
    assert config["eos_token_id"] == tokenizer.eot is not None
    tokens = np.random.default_rng(0).integers(0, 300, size=(2, 64))
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(tokens)))[..., :300]
    np.testing.assert_allclose(ours, hf_logits(out, tokens), atol=1e-4, rtol=0)

    proc = run_python("-m", "theseus.export", str(run), str(out), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"theseus: error: {out} exists and is not an empty folder: "
                                   "export into a new folder (or remove it)")
