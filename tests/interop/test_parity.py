"""Imported checkpoints compute what transformers computes: logits, greedy generation, and
import then export gives back every tensor bit for bit, for every family (hf_models.FAMILIES:
Llama 3.x's scaled RoPE, Qwen3's q/k norms, Mistral's and Phi-3's sliding windows, Phi-3's fused
projections, Gemma 2's and 3's sliding and global layers, soft-caps and norms)."""

from __future__ import annotations

import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from interop.hf_models import hf_logits, target_of, theseus_model, transformers, torch
from safetensors.numpy import load_file

from theseus.config import ConfigError
from theseus.interop.hf_config import SPECIAL_TOKENS, architecture, arch_of, hf_config, model_type, read_config
from theseus.interop.hf_weights import WEIGHTS_FILE, to_hf
from theseus.model.generate import complete, generate
from theseus.model.sampling import Sampling
from theseus.sources.weights import load_params

MIXED = ("qwen2_moe", "gemma2", "gemma3")  # layers that differ (dense and sparse, sliding and global)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_logits_equal_transformers(any_hf_folder, scan_layers):
    if scan_layers and any_hf_folder.name.startswith(MIXED):  # a scan repeats one block: refused in one line
        with pytest.raises(ConfigError, match=r"^architecture.scan_layers=true repeats one block, but .*"
                                              r"architecture.scan_layers=false$"):
            theseus_model(any_hf_folder, scan_layers=True)
        return
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
    exported = to_hf(model_type(arch, prefer=read_config(any_hf_folder)["model_type"]), arch, flat, model.vocab_size)
    original = load_file(str(any_hf_folder / WEIGHTS_FILE))
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert exported[name].dtype == tensor.dtype and exported[name].tobytes() == tensor.tobytes(), name


def test_the_exported_config_is_the_checkpoints_own(any_hf_folder, tmp_path):
    """config.json written from the architecture alone (of the base, only its model_type: Phi-3
    computes what Mistral does) loads in transformers as the original: the same model_type,
    architecture and logits."""
    model = theseus_model(any_hf_folder)
    arch = arch_of(model)
    original = json.loads((any_hf_folder / "config.json").read_text())
    config = hf_config(arch, model.vocab_size, {key: original.get(key) for key in SPECIAL_TOKENS},
                       base={"model_type": original["model_type"]})
    assert config["model_type"] == original["model_type"]
    assert architecture(config) == architecture(original)
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(any_hf_folder / WEIGHTS_FILE, tmp_path)
    tokens = np.random.default_rng(3).integers(0, model.vocab_size, size=(2, 16))
    np.testing.assert_array_equal(hf_logits(tmp_path, tokens), hf_logits(any_hf_folder, tokens))


@pytest.mark.slow
def test_greedy_generation_equals_transformers(any_hf_folder):
    """Through the KV cache, to 27 positions: past every family's sliding window (8 or 12); two
    prompts, of 7 tokens and of 4 (then 3 padding tokens), in one batch, each row at its own
    positions, as transformers continues each alone: its tokens, and each token's
    log-probability (which a wrong mask shows where the argmax stays)."""
    model = theseus_model(any_hf_folder)
    params = load_params(any_hf_folder, arch_of(model), target_of(model))
    prompts, lengths = np.random.default_rng(1).integers(0, model.vocab_size, size=(2, 7)), [7, 4]
    hf = transformers.AutoModelForCausalLM.from_pretrained(any_hf_folder).eval()
    ours = complete(model, params, prompts, lengths, 20, Sampling(0.0), logprobs=True)
    for row, length in enumerate(lengths):
        prompt = torch.from_numpy(prompts[row:row + 1, :length])
        with torch.no_grad():
            out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=20,
                              min_new_tokens=20, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        tokens = out.sequences[0, length:]
        logprobs = torch.stack([torch.log_softmax(step[0].double(), -1)[t] for step, t in zip(out.logits, tokens)])
        np.testing.assert_array_equal(np.asarray(ours.tokens[row]), tokens.numpy())
        np.testing.assert_allclose(np.asarray(ours.logprobs[row]), logprobs.numpy(), atol=2e-4)
    np.testing.assert_array_equal(generate(model, params, prompts, 20, temperature=0.0)[0, 7:], ours.tokens[0])


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


def test_a_fine_tunes_export_keeps_the_base_configs_other_fields(llama3_folder):
    """A merged export of a run from a folder: the base's max_position_embeddings (not the
    fine-tune's lowered architecture.seq_len), its rope scaling, token ids and fields theseus does
    not read stay; what theseus computes (the dtype) is its own; the base's quantization is dropped."""
    base = {**read_config(llama3_folder), "bos_token_id": 5, "eos_token_id": [6, 7], "pretraining_tp": 1,
            "custom_field": {"kept": True}, "torch_dtype": "bfloat16", "quantization_config": {"bits": 4}}
    arch = {**architecture(base), "seq_len": 32}  # a fine-tune at a shorter context
    config = hf_config(arch, base["vocab_size"], base, dtype="float32", base=base)
    assert config["max_position_embeddings"] == 128 and config["rope_parameters"] == base["rope_parameters"]
    assert (config["dtype"], config["torch_dtype"]) == ("float32", "float32")
    kept = {key: value for key, value in base.items() if key not in ("dtype", "torch_dtype", "quantization_config")}
    assert {key: config[key] for key in kept} == kept and "quantization_config" not in config
    assert set(config) - set(base) <= {"rope_theta"}  # transformers 4's place for it, beside rope_parameters
    assert hf_config(arch, base["vocab_size"], base)["max_position_embeddings"] == 32  # no base: the run's own


@pytest.mark.parametrize(("entry", "message"), [
    ({"model_type": "llama", "rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
     "RoPE scaling 'yarn' is not supported (theseus computes linear, llama3 and the default, unscaled RoPE)"),
    ({"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
     "RoPE scaling 'longrope' is not supported"),
    ({"model_type": "phi3", "partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 is not supported"),
    ({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "RoPE scaling 'llama3' has no low_freq_factor: give it in rope_parameters"),
    ({"model_type": "qwen3", "use_sliding_window": True}, "use_sliding_window=True is not supported for model_type"),
    ({"model_type": "gemma2", "num_hidden_layers": 3, "layer_types": ["full_attention", "sliding_attention",
                                                                      "sliding_attention"]},
     "layer_types ['full_attention', 'sliding_attention', 'sliding_attention'] do not alternate"),
    ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    ({"model_type": "gemma3_text", "rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
     "RoPE scaling of the sliding_attention layers is not supported"),
    ({"model_type": "qwen3_moe"}, "model_type 'qwen3_moe' is not supported; theseus imports gpt2, llama, qwen2, qwen3, mistral, phi3, gemma2"),
])
def test_what_a_family_computes_otherwise_is_refused_in_one_line(entry, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        architecture(entry, where="config.json")
    assert str(error.value).startswith("config.json: ") and "\n" not in str(error.value)


@pytest.mark.parametrize("window", [None, 4])
def test_gemma_layer_types_round_trip(window):
    """Gemma 3's sliding_window_pattern (no layer_types) becomes every N-th layer global; export
    writes transformers' layer_types back (every layer global without a window), read as they were."""
    given = {"model_type": "gemma3_text", "num_hidden_layers": 5, "sliding_window": window,
             "sliding_window_pattern": 3, "rope_local_base_freq": 20000.0, "rope_theta": 5e5}
    arch = architecture(given)
    assert (arch["global_every"], arch["rope_theta_local"], arch["rope_theta"]) == (3 if window else 0, 20000.0, 5e5)
    config = hf_config(arch, arch["vocab_size"], {})
    assert config["layer_types"] == (["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2
                                     if window else ["full_attention"] * 5)
    assert config["rope_parameters"]["sliding_attention"] == {"rope_type": "default", "rope_theta": 20000.0}
    assert architecture(config) == arch
