"""Local folders for task=dpo's tests (nothing downloaded): tiny random Llamas with a ChatML
tokenizer whose post-processor adds a BOS, and preference rows of several shapes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from data.chat_folders import chatml_bos_folder

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def standard_rows(n: int = 12) -> list[dict]:
    """Prompts and completions of several shapes: a completion ending in the eos already, one
    whose first token merges with the prompt's last (``common_prefix_length``), one with a space."""
    rows = [{"prompt": f"Q{i}: what is {i} and {i + 1}? It is", "chosen": f" {2 * i + 1}.",
             "rejected": f" {i}{i}, I think" + "!" * (i % 3)} for i in range(n - 2)]
    rows[1]["chosen"] += "<|im_end|>"
    return [*rows, {"prompt": "Say yes ", "chosen": "yes", "rejected": "no no"},
            {"prompt": "Count:", "chosen": " one two three", "rejected": " three"}]


def conversational_rows(n: int = 12) -> list[dict]:
    rows = [{"prompt": [{"role": "user", "content": row["prompt"]}],
             "chosen": [{"role": "assistant", "content": row["chosen"].strip()}],
             "rejected": [{"role": "assistant", "content": row["rejected"].strip()}]} for row in standard_rows(n)]
    rows[0]["prompt"].insert(0, {"role": "system", "content": "You add."})
    return rows



def random_llama(folder: Path, seed: int) -> Path:
    """A tiny Llama with weights drawn from N(0, 0.2) by ``seed``, and the tokenizer above."""
    config = transformers.LlamaConfig(vocab_size=400, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      tie_word_embeddings=False, bos_token_id=3, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.eval().save_pretrained(folder, safe_serialization=True)
    return chatml_bos_folder(folder)


def transformers_logps(folder: Path, pairs) -> np.ndarray:
    """float32 [pairs, 2]: transformers' log-probs of each pair's completions (``(prompt, chosen,
    rejected)`` ids) under ``folder``'s model."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    out = []
    for prompt, *completions in pairs:
        for done in completions:
            ids = torch.tensor(np.concatenate([prompt, done]))[None]
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            out.append(float(logp[len(prompt) - 1:].gather(-1, ids[0, len(prompt):, None]).sum()))
    return np.asarray(out, np.float32).reshape(-1, 2)


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
