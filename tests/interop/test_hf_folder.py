"""A Hugging Face folder sampled and evaluated as it is, without training: ``python -m
theseus.sample FOLDER`` and ``python -m theseus.evaluate FOLDER data.*=...``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from interop.hf_models import CORPUS, hf_val_loss, torch, transformers

from support import run_python
from theseus.data.tokenizer import HFTokenizer

PROMPT = "def __init__"


def hf_greedy(folder: Path, prompt: str, n: int) -> str:
    """transformers' greedy continuation of ``prompt`` by ``n`` tokens, decoded by the folder's tokenizer."""
    tokenizer = HFTokenizer.from_file(folder / "tokenizer.json")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                          min_new_tokens=n, pad_token_id=0)
    return tokenizer.decode(out[0, ids.shape[1]:].tolist())


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
    for command in ("theseus.sample", "theseus.evaluate"):
        proc = run_python("-m", command, str(tmp_path), cwd=tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.strip() == (f"theseus: error: {tmp_path} is neither a run directory (.hydra/config.yaml) "
                                       f"nor a Hugging Face folder (config.json): give the folder a run wrote or one "
                                       f"save_pretrained wrote")


def test_a_folder_has_no_checkpoint_steps(gpt2_folder, tmp_path):
    proc = run_python("-m", "theseus.sample", str(gpt2_folder), "--step", "3", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"theseus: error: --step 3: {gpt2_folder} is a Hugging Face folder, which holds "
                                   "one set of weights (checkpoint steps are a theseus run's)")
