"""A Hugging Face ``config.json`` <-> theseus's ``architecture.*`` values, per ``model_type``.

    hf = read_config(folder)          # the folder's config.json, as a dict
    arch = architecture(hf)           # {"n_layers": 12, "d_model": 768, ...}: architecture.* keys
    hf_again = hf_config(arch, vocab_size=50257, eos=50256)

Only what theseus's GPT computes exactly is accepted: GPT-2 (``gpt2``: learned positions,
LayerNorm, tanh-GELU, biases), Llama (``llama``: RoPE, RMSNorm, SwiGLU, no biases, grouped
-query attention) and Qwen2 (``qwen2``: Llama's layout with biases on q, k and v alone).
Anything else (RoPE scaling, a sliding window, Llama's attention biases) is refused in one
line rather than imported approximately.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.config import ConfigError

CONFIG_FILE = "config.json"
SUPPORTED = ("gpt2", "llama", "qwen2")
SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id")

# The architecture values a GPT's fields hold (theseus.model.models.gpt.GPT), as interop uses them.
ARCH_KEYS = ("vocab_size", "seq_len", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "bias", "qkv_bias",
             "norm", "norm_eps", "activation", "positions", "rope_theta", "tie_embeddings", "dropout")
# The architecture.* keys each model_type's config.json expresses (``architecture`` reads them back,
# ``hf_config`` writes them); ``model_type`` has checked the layout keys' values. A key outside this
# table changes what the model computes unless it is at its default.
_LAYERS = frozenset(ARCH_KEYS) - {"rope_theta", "dropout"}
EXPRESSED: dict[str, frozenset[str]] = {"gpt2": _LAYERS, "llama": _LAYERS | {"rope_theta"},
                                        "qwen2": _LAYERS | {"rope_theta"}}


def read_config(folder: Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict; ConfigError when the folder or file is missing or broken."""
    path = folder / CONFIG_FILE
    if not folder.is_dir():
        raise ConfigError(f"trainer.init_from={folder} is not a folder: give a local Hugging Face model folder "
                          f"(config.json and model.safetensors)")
    if not path.is_file():
        raise ConfigError(f"trainer.init_from={folder} has no {CONFIG_FILE}: give a Hugging Face model folder "
                          f"(saved by save_pretrained)")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path} does not parse as JSON ({exc})") from exc
    if not isinstance(hf, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return hf


def architecture(hf: Mapping[str, Any], where: str = CONFIG_FILE) -> dict[str, Any]:
    """The ``architecture.*`` values (keys without the prefix) of a Hugging Face config.

    Missing entries take transformers' defaults for that model_type, as its config class
    would. ``where`` names the file in error messages.
    """
    model_type = hf.get("model_type")
    if model_type == "gpt2":
        return _gpt2(hf, where)
    if model_type in ("llama", "qwen2"):
        return _llama(hf, where)
    raise ConfigError(f"{where}: model_type {model_type!r} is not supported; theseus imports "
                      f"{', '.join(SUPPORTED)}")


def _gpt2(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    _require(hf, where, "activation_function", "gelu_new", ("gelu_new", "gelu_pytorch_tanh"))
    _require(hf, where, "scale_attn_weights", True, (True,))
    _require(hf, where, "scale_attn_by_inverse_layer_idx", False, (False,))
    d_model = hf.get("n_embd", 768)
    return {
        "vocab_size": hf.get("vocab_size", 50257), "seq_len": hf.get("n_positions", 1024),
        "n_layers": hf.get("n_layer", 12), "d_model": d_model, "n_heads": hf.get("n_head", 12),
        "n_kv_heads": None, "d_ff": hf.get("n_inner") or 4 * d_model, "bias": True, "qkv_bias": False,
        "norm": "layernorm", "norm_eps": float(hf.get("layer_norm_epsilon", 1e-5)), "activation": "gelu",
        "positions": "learned", "tie_embeddings": hf.get("tie_word_embeddings", True),
    }


def _llama(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Llama, or Qwen2 (the same but biases on q, k and v, and no sliding window)."""
    qwen2 = hf["model_type"] == "qwen2"
    _require(hf, where, "hidden_act", "silu", ("silu",))
    _require(hf, where, "attention_bias", False, (False,))
    _require(hf, where, "mlp_bias", False, (False,))
    _require(hf, where, "use_sliding_window", False, (False,))
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})  # transformers 5 / 4
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(f"{where}: RoPE scaling {rope.get('rope_type', rope.get('type'))!r} is not supported "
                          f"(theseus's RoPE is the default, unscaled one)")
    d_model, n_heads = hf.get("hidden_size", 4096), hf.get("num_attention_heads", 32)
    head_dim = hf.get("head_dim") or d_model // n_heads
    if head_dim * n_heads != d_model:
        raise ConfigError(f"{where}: head_dim={head_dim} x num_attention_heads={n_heads} != hidden_size={d_model}; "
                          f"theseus's heads split d_model")
    return {
        "vocab_size": hf.get("vocab_size", 32000), "seq_len": hf.get("max_position_embeddings", 2048),
        "n_layers": hf.get("num_hidden_layers", 32), "d_model": d_model, "n_heads": n_heads,
        "n_kv_heads": hf.get("num_key_value_heads") or n_heads, "d_ff": hf.get("intermediate_size", 11008),
        "bias": False, "qkv_bias": qwen2, "norm": "rmsnorm", "norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
        "activation": "swiglu", "positions": "rope",
        "rope_theta": float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        "tie_embeddings": hf.get("tie_word_embeddings", False),
    }


def _require(hf: Mapping[str, Any], where: str, key: str, default: Any, allowed: tuple) -> None:
    value = hf.get(key, default)
    if value not in allowed:
        raise ConfigError(f"{where}: {key}={value!r} is not supported for model_type {hf['model_type']} "
                          f"(theseus computes {' or '.join(map(repr, allowed))})")


def model_type(arch: Mapping[str, Any]) -> str:
    """The Hugging Face model_type that computes what ``arch`` does; ConfigError when none does."""
    layout = (arch["positions"], arch["norm"], arch["activation"], arch["bias"])
    if layout == ("learned", "layernorm", "gelu", True) and arch["n_kv_heads"] in (None, arch["n_heads"]):
        return "gpt2"
    if layout == ("rope", "rmsnorm", "swiglu", False):
        return "qwen2" if arch["qkv_bias"] else "llama"
    raise ConfigError(
        f"architecture positions={arch['positions']} norm={arch['norm']} activation={arch['activation']} "
        f"bias={arch['bias']} n_kv_heads={arch['n_kv_heads']} has no Hugging Face model_type: export writes gpt2 "
        f"(learned, layernorm, gelu, bias=true, no GQA), llama (rope, rmsnorm, swiglu, bias=false) or qwen2 "
        f"(llama's, with qkv_bias=true)")


def hf_config(arch: Mapping[str, Any], vocab_size: int, special: Mapping[str, int | None],
              dtype: str = "float32") -> dict[str, Any]:
    """The config.json of ``arch`` with ``vocab_size`` rows; ``special``: the ids of SPECIAL_TOKENS
    (an imported checkpoint's own, or the tokenizer's end-of-text); ``dtype``: the tensors'."""
    d_ff = arch["d_ff"] or 4 * arch["d_model"]
    common = {"vocab_size": vocab_size, "tie_word_embeddings": arch["tie_embeddings"],
              **{key: special.get(key) for key in SPECIAL_TOKENS}, "dtype": dtype}
    kind = model_type(arch)
    if kind == "gpt2":
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], **common,
                "n_positions": arch["seq_len"], "n_embd": arch["d_model"], "n_layer": arch["n_layers"],
                "n_head": arch["n_heads"], "n_inner": d_ff, "activation_function": "gelu_new",
                "layer_norm_epsilon": arch["norm_eps"], "resid_pdrop": arch["dropout"],
                "embd_pdrop": arch["dropout"], "attn_pdrop": 0.0}
    own = ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False} if kind == "qwen2"
           else {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "mlp_bias": False})
    return {"model_type": kind, **own, **common,
            "max_position_embeddings": arch["seq_len"], "hidden_size": arch["d_model"],
            "num_hidden_layers": arch["n_layers"], "num_attention_heads": arch["n_heads"],
            "num_key_value_heads": arch["n_kv_heads"] or arch["n_heads"],
            "head_dim": arch["d_model"] // arch["n_heads"], "intermediate_size": d_ff, "hidden_act": "silu",
            "rms_norm_eps": arch["norm_eps"],
            "rope_theta": arch["rope_theta"],  # transformers 4; transformers 5 reads rope_parameters
            "rope_parameters": {"rope_type": "default", "rope_theta": arch["rope_theta"]},
            "attention_dropout": 0.0}


def arch_of(model: Any) -> dict[str, Any]:
    """The architecture values of a built GPT (its fields), as ``hf_config`` and hf_weights take them."""
    return {key: getattr(model, key) for key in ARCH_KEYS}
