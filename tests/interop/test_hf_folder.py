"""A Hugging Face folder sampled and evaluated as it is, without training: ``python -m
theseus.sample FOLDER`` and ``python -m theseus.evaluate FOLDER data.*=...``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from interop.hf_models import CORPUS, hf_val_loss, llama_config, save_hf, torch, transformers

from support import run_python
from theseus.data.tokenizer import HFTokenizer, escape_controls

PROMPT = "def __init__"


def hf_greedy(folder: Path, prompt: str, n: int) -> str:
    """transformers' greedy continuation of ``prompt`` by ``n`` tokens, decoded by the folder's
    tokenizer; as theseus.sample, it never chooses an id past the tokenizer's vocabulary (the
    model's is larger)."""
    tokenizer = HFTokenizer.from_file(folder / "tokenizer.json")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                          min_new_tokens=n, pad_token_id=0,
                          suppress_tokens=list(range(tokenizer.vocab_size, hf.config.vocab_size)))
    return escape_controls(tokenizer.decode(out[0, ids.shape[1]:].tolist()))  # as sample shows it: printable


@pytest.mark.slow
@pytest.mark.parametrize("devices", [None, 8])  # 8: the default mesh (data over every device), as a run lays it out
def test_sampling_a_folder_greedily_equals_transformers(hf_folder, tmp_path, devices):
    proc = run_python("-m", "theseus.sample", str(hf_folder), "--prompt", PROMPT, "--max-new-tokens", "12",
                      "--temperature", "0", devices=devices, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == PROMPT + hf_greedy(hf_folder, PROMPT, 12) + "\n"
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_sampling_a_mixture_of_experts_folder_greedily_equals_transformers(kind, request, tmp_path):
    """model=moe from the folder's model_type, with nothing given but the folder."""
    folder = request.getfixturevalue(f"{kind}_folder")
    proc = run_python("-m", "theseus.sample", str(folder), "--prompt", PROMPT, "--max-new-tokens", "12",
                      "--temperature", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == PROMPT + hf_greedy(folder, PROMPT, 12) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "qwen2_moe"])
def test_evaluating_a_folder_gives_transformers_loss_on_the_same_batches(kind, request, tmp_path):
    folder = request.getfixturevalue(f"{kind}_folder")
    corpus = tmp_path / "notes.txt"
    corpus.write_text(CORPUS.read_text() * 2)
    overrides = ["data.source=text", f"data.path={corpus}", f"data.cache_dir={tmp_path / 'cache'}",
                 "trainer.batch_size=2", "trainer.eval_batches=2"]
    out = tmp_path / "eval.json"
    proc = run_python("-m", "theseus.evaluate", str(folder), *overrides, "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["step"] is None and record["mesh"] == {"data": record["mesh"]["data"], "fsdp": 1, "expert": 1,
                                                         "tensor": 1}  # data: a device per core
    assert "val_loss" in proc.stdout

    # the batches the evaluation reads (the trainer's validation loader), scored by transformers
    assert record["metrics"]["val_loss"] == pytest.approx(hf_val_loss(folder, overrides, 64, 2, 2), rel=1e-4)


def test_a_folder_without_its_tokenizer_cannot_be_sampled(llama_sharded_folder, tmp_path):
    proc = run_python("-m", "theseus.sample", str(llama_sharded_folder), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"theseus: error: {llama_sharded_folder} has no tokenizer.json: save the model's "
                                   "tokenizer beside it (tokenizer.save_pretrained(folder) writes it)")


@pytest.mark.slow
def test_a_folder_that_is_neither_is_one_line(tmp_path):
    for command in ("theseus.sample", "theseus.evaluate", "theseus.export"):
        proc = run_python("-m", command, str(tmp_path), *(["out"] if command == "theseus.export" else []),
                          cwd=tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.strip() == (f"theseus: error: {tmp_path} holds no model (no config.json, no checkpoints): "
                                       f"give a Hugging Face folder, a theseus run or checkpoint, a .gguf file or a "
                                       f"model id in the local Hugging Face cache")
        assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def long_context_folder(tmp_path_factory) -> Path:
    """A Llama whose context (8192) outruns a small corpus: SmolLM2's, at a tiny width."""
    config = llama_config()
    config.max_position_embeddings = 8192
    return save_hf(transformers.LlamaForCausalLM(config), tmp_path_factory.mktemp("long"))


@pytest.mark.slow
def test_a_long_context_folder_is_evaluated_in_a_window_the_data_fills(long_context_folder, tmp_path):
    """No window is given: the data's, shorter than the model's 8192 and than 1024; the loss is
    transformers' on those windows, and nothing is written without --out (not in the folder)."""
    corpus = tmp_path / "notes.txt"
    corpus.write_text(CORPUS.read_text()[:6000])
    overrides = ["data.source=text", f"data.path={corpus}", f"data.cache_dir={tmp_path / 'cache'}",
                 "trainer.batch_size=1", "trainer.eval_batches=1"]
    before = sorted(long_context_folder.iterdir())
    proc = run_python("-m", "theseus.evaluate", str(long_context_folder), *overrides, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(long_context_folder.iterdir()) == before and sorted(p.name for p in tmp_path.iterdir()) == \
        ["cache", "notes.txt"]
    window = int(re.search(r"windows of (\d+) tokens", proc.stdout).group(1))
    assert 16 < window < 1024
    loss = float(re.search(r"val_loss\s*│\s*([0-9.]+)", proc.stdout).group(1))
    assert loss == pytest.approx(hf_val_loss(long_context_folder, overrides, window, 1, 1), abs=1e-4)
    out = tmp_path / "eval.json"
    proc = run_python("-m", "theseus.evaluate", str(long_context_folder), *overrides, "architecture.seq_len=16",
                      "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["seq_len"] == 16


def test_a_folder_has_no_checkpoint_steps(gpt2_folder, tmp_path):
    proc = run_python("-m", "theseus.sample", str(gpt2_folder), "--step", "3", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"theseus: error: --step 3: {gpt2_folder} is a Hugging Face folder, which holds "
                                   "one set of weights (checkpoint steps are a theseus run's)")
