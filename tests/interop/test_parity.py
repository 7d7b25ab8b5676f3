"""Imported checkpoints compute what transformers computes: logits, greedy generation, and
import then export gives back every tensor bit for bit."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from interop.hf_models import hf_logits, target_of, theseus_model, transformers, torch
from safetensors.numpy import load_file

from theseus.interop.hf_config import SPECIAL_TOKENS, arch_of, hf_config, model_type
from theseus.interop.hf_weights import WEIGHTS_FILE, to_hf
from theseus.interop.loading import load_params
from theseus.model.generate import generate


@pytest.mark.parametrize("scan_layers", [False, True])
def test_logits_equal_transformers(any_hf_folder, scan_layers):
    if scan_layers and any_hf_folder.name.startswith("qwen2_moe"):
        pytest.skip("its dense and sparse layers differ: a scan repeats one block")
    model = theseus_model(any_hf_folder, scan_layers=scan_layers)  # scanned: the layers stacked as they load
    params = load_params(any_hf_folder, arch_of(model), target_of(model))
    tokens = np.random.default_rng(0).integers(0, model.vocab_size, size=(3, 40))
    reference = hf_logits(any_hf_folder, tokens)
    logits = jax.jit(model.apply)({"params": params}, jnp.asarray(tokens, jnp.int32))
    assert logits.shape == reference.shape and model.vocab_size % 128  # the checkpoint's own, unpadded vocab
    assert np.abs(reference).max() > 1.0  # the tolerance is small against the logits
    np.testing.assert_allclose(np.asarray(logits), reference, atol=1e-4, rtol=0)


def test_import_then_export_is_bitwise_identity(any_hf_folder):
    model = theseus_model(any_hf_folder)
    arch = arch_of(model)
    params = load_params(any_hf_folder, arch, target_of(model))
    flat = {path: np.asarray(value) for path, value in traverse_util.flatten_dict(params, sep="/").items()}
    exported = to_hf(model_type(arch), arch, flat, model.vocab_size)
    original = load_file(str(any_hf_folder / WEIGHTS_FILE))
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert exported[name].dtype == tensor.dtype and exported[name].tobytes() == tensor.tobytes(), name


def test_the_exported_config_is_the_checkpoints_own(any_hf_folder, tmp_path):
    """config.json written from the architecture loads in transformers as the original: the
    exported folder computes the same logits."""
    model = theseus_model(any_hf_folder)
    arch = arch_of(model)
    original = json.loads((any_hf_folder / "config.json").read_text())
    config = hf_config(arch, model.vocab_size, {key: original.get(key) for key in SPECIAL_TOKENS})
    assert config["model_type"] == original["model_type"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(any_hf_folder / WEIGHTS_FILE, tmp_path)
    tokens = np.random.default_rng(3).integers(0, model.vocab_size, size=(2, 16))
    np.testing.assert_array_equal(hf_logits(tmp_path, tokens), hf_logits(any_hf_folder, tokens))


@pytest.mark.slow
def test_greedy_generation_equals_transformers(any_hf_folder):
    model = theseus_model(any_hf_folder)
    params = load_params(any_hf_folder, arch_of(model), target_of(model))
    prompt = np.random.default_rng(1).integers(0, model.vocab_size, size=(2, 7))
    hf = transformers.AutoModelForCausalLM.from_pretrained(any_hf_folder).eval()
    with torch.no_grad():
        expected = hf.generate(torch.from_numpy(prompt), attention_mask=torch.ones_like(torch.from_numpy(prompt)),
                               do_sample=False, max_new_tokens=20, min_new_tokens=20, pad_token_id=0).numpy()
    tokens = generate(model, params, prompt, max_new_tokens=20, temperature=0.0)
    assert expected.shape == (2, 27)
    np.testing.assert_array_equal(np.asarray(tokens), expected)


@pytest.mark.parametrize("seq_len", [24])
def test_a_lowered_seq_len_cuts_the_position_table(gpt2_folder, seq_len):
    from theseus.config import configuration, configure
    from theseus.model.models.gpt import GPT

    full = theseus_model(gpt2_folder)
    with configuration(full.own_configuration()):
        model = configure(GPT, seq_len=seq_len)
    params = load_params(gpt2_folder, arch_of(model), target_of(model))
    assert params["wpe"]["embedding"].shape == (seq_len, 64)
    tokens = np.random.default_rng(2).integers(0, 301, size=(1, seq_len))
    np.testing.assert_allclose(np.asarray(model.apply({"params": params}, jnp.asarray(tokens))),
                               hf_logits(gpt2_folder, tokens), atol=1e-4, rtol=0)


@pytest.mark.parametrize("entry", [{"mlp_only_layers": [0]}, {"qkv_bias": False}])
def test_qwen2_moe_layouts_theseus_does_not_compute_are_refused(entry):
    from theseus.config import ConfigError
    from theseus.interop.hf_config import architecture

    with pytest.raises(ConfigError, match=f"{next(iter(entry))}=.* is not supported for model_type qwen2_moe"):
        architecture({"model_type": "qwen2_moe", **entry})
