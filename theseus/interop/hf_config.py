"""A Hugging Face ``config.json`` <-> theseus's ``architecture.*`` values, one table per ``model_type``.

    hf = read_config(folder)          # the folder's config.json, as a dict
    arch = architecture(hf)           # {"n_layers": 12, "d_model": 768, ...}: architecture.* keys
    hf_again = hf_config(arch, vocab_size=50257, special={"eos_token_id": 50256})

Each ``Format`` declares, for one model_type, which config.json key holds each architecture key
(read on import, written on export), the architecture values the model_type implies (its layout:
set on import, matched on export) and the config.json values theseus computes (checked on
import, written on export). Only what theseus computes exactly is accepted: GPT-2 (``gpt2``),
Llama (``llama``), Qwen2 (``qwen2``: Llama's layout with biases on q, k and v), and with
``model=moe`` Mixtral (``mixtral``: top-k experts, renormalised) and Qwen2-MoE (``qwen2_moe``:
experts plus a sigmoid-gated shared expert), both dropless. Anything else (RoPE scaling, a
sliding window, Llama's attention biases, Qwen2-MoE's ``mlp_only_layers``) is refused in one
line rather than imported approximately.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from theseus.config import ConfigError
from theseus.config.fields import MISSING
from theseus.config.schema import schema_of

CONFIG_FILE = "config.json"
SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclass(frozen=True)
class Format:
    """One model_type's config.json.

    ``keys``: architecture key -> (config.json key, transformers' default when it is absent);
    ``implied``: architecture values the model_type computes; ``required``: config.json key ->
    the values theseus computes (the first is written, and is transformers' default);
    ``written``: config.json key -> the architecture key export writes there (not read back:
    training settings such as dropout); ``constants``: config.json values export writes, never
    read; ``model``: the theseus model (``model=...``) that computes it.
    """

    model_type: str
    architectures: str
    keys: dict[str, tuple[str, Any]]
    implied: dict[str, Any]
    required: dict[str, tuple] = field(default_factory=dict)
    written: dict[str, str] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)
    model: str = "gpt"


ROPE_THETA = "rope_theta"  # in rope_parameters (transformers 5) or at the top level (4): both are written
_LLAMA_LAYOUT = {"bias": False, "norm": "rmsnorm", "activation": "swiglu", "positions": "rope"}


def _llama_keys(vocab: int, seq: int, d: int, layers: int, heads: int, kv: int | None, d_ff: int, eps: float,
                theta: float, head_dim: str = "head_dim") -> dict[str, tuple[str, Any]]:
    """The config.json keys Llama and its descendants share (transformers' defaults differ)."""
    return {"vocab_size": ("vocab_size", vocab), "seq_len": ("max_position_embeddings", seq),
            "n_layers": ("num_hidden_layers", layers), "d_model": ("hidden_size", d),
            "n_heads": ("num_attention_heads", heads), "n_kv_heads": ("num_key_value_heads", kv),
            "d_ff": ("intermediate_size", d_ff), "norm_eps": ("rms_norm_eps", eps),
            "rope_theta": ("rope_theta", theta), "tie_embeddings": ("tie_word_embeddings", False)}


_NO_DROPOUT = {"attention_dropout": 0.0}
_MOE = {"moe.n_experts": ("num_experts", 60), "moe.top_k": ("num_experts_per_tok", 4),
        "moe.aux_loss": ("router_aux_loss_coef", 0.001)}

FORMATS: dict[str, Format] = {f.model_type: f for f in (
    Format("gpt2", "GPT2LMHeadModel",
           keys={"vocab_size": ("vocab_size", 50257), "seq_len": ("n_positions", 1024), "n_layers": ("n_layer", 12),
                 "d_model": ("n_embd", 768), "n_heads": ("n_head", 12), "d_ff": ("n_inner", None),
                 "norm_eps": ("layer_norm_epsilon", 1e-5), "tie_embeddings": ("tie_word_embeddings", True)},
           implied={"n_kv_heads": None, "bias": True, "qkv_bias": False, "norm": "layernorm", "activation": "gelu",
                    "positions": "learned"},
           required={"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "scale_attn_weights": (True,),
                     "scale_attn_by_inverse_layer_idx": (False,)},
           written={"resid_pdrop": "dropout", "embd_pdrop": "dropout"}, constants={"attn_pdrop": 0.0}),
    Format("llama", "LlamaForCausalLM", keys=_llama_keys(32000, 2048, 4096, 32, 32, None, 11008, 1e-6, 10000.0),
           implied={**_LLAMA_LAYOUT, "qkv_bias": False},
           required={"hidden_act": ("silu",), "attention_bias": (False,), "mlp_bias": (False,),
                     "attention_dropout": (0.0,)}),
    Format("qwen2", "Qwen2ForCausalLM", keys=_llama_keys(151936, 32768, 4096, 32, 32, None, 22016, 1e-6, 10000.0),
           implied={**_LLAMA_LAYOUT, "qkv_bias": True},
           required={"hidden_act": ("silu",), "use_sliding_window": (False,)}, constants=_NO_DROPOUT),
    Format("mixtral", "MixtralForCausalLM",
           keys={**_llama_keys(32000, 131072, 4096, 32, 32, 8, 14336, 1e-5, 1000000.0),
                 "moe.n_experts": ("num_local_experts", 8), "moe.top_k": ("num_experts_per_tok", 2),
                 "moe.aux_loss": ("router_aux_loss_coef", 0.001)},
           implied={**_LLAMA_LAYOUT, "qkv_bias": False, "moe.norm_topk_prob": True, "moe.capacity_factor": None,
                    "moe.d_ff": None, "moe.shared_d_ff": 0, "moe.shared_gate": False, "moe.every": 1},
           required={"hidden_act": ("silu",), "sliding_window": (None,)}, constants=_NO_DROPOUT,
           model="moe"),
    Format("qwen2_moe", "Qwen2MoeForCausalLM",
           keys={**_llama_keys(151936, 32768, 2048, 24, 16, None, 5632, 1e-6, 10000.0), **_MOE,
                 "moe.d_ff": ("moe_intermediate_size", 1408),
                 "moe.shared_d_ff": ("shared_expert_intermediate_size", 5632),
                 "moe.norm_topk_prob": ("norm_topk_prob", False), "moe.every": ("decoder_sparse_step", 1)},
           implied={**_LLAMA_LAYOUT, "qkv_bias": True, "moe.capacity_factor": None, "moe.shared_gate": True},
           required={"hidden_act": ("silu",), "use_sliding_window": (False,), "qkv_bias": (True,),
                     "mlp_only_layers": ([],)}, constants=_NO_DROPOUT,
           model="moe"),
)}
SUPPORTED = tuple(FORMATS)


def read_config(folder: Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict (a Hugging Face folder: ``theseus.model.source`` found
    it); ConfigError when it does not parse as a JSON object."""
    path = folder / CONFIG_FILE
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path} does not parse as JSON ({exc})") from exc
    if not isinstance(hf, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return hf


def format_of(hf: Mapping[str, Any], where: str = CONFIG_FILE) -> Format:
    """The Format of a config.json's model_type; ConfigError when theseus has none."""
    kind = hf.get("model_type")
    if kind not in FORMATS:
        raise ConfigError(f"{where}: model_type {kind!r} is not supported; theseus imports {', '.join(SUPPORTED)}")
    return FORMATS[kind]


def architecture(hf: Mapping[str, Any], where: str = CONFIG_FILE) -> dict[str, Any]:
    """The ``architecture.*`` values (keys without the prefix) of a Hugging Face config.

    Missing entries take transformers' defaults for that model_type, as its config class
    would. ``where`` names the file in error messages.
    """
    fmt = format_of(hf, where)
    for key, allowed in fmt.required.items():
        value = hf.get(key, allowed[0])
        if value not in allowed:
            raise ConfigError(f"{where}: {key}={value!r} is not supported for model_type {fmt.model_type} "
                              f"(theseus computes {' or '.join(map(repr, allowed))})")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})  # transformers 5 / 4
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(f"{where}: RoPE scaling {rope.get('rope_type', rope.get('type'))!r} is not supported "
                          f"(theseus's RoPE is the default, unscaled one)")
    arch = dict(fmt.implied)
    for key, (name, default) in fmt.keys.items():
        arch[key] = rope.get(name, hf.get(name, default)) if name == ROPE_THETA else hf.get(name, default)
    arch = _resolved(arch, fmt)
    if "rope_theta" in arch:
        arch["rope_theta"] = float(arch["rope_theta"])
    arch["norm_eps"] = float(arch["norm_eps"])
    head_dim = hf.get("head_dim") or arch["d_model"] // arch["n_heads"]
    if head_dim * arch["n_heads"] != arch["d_model"]:
        raise ConfigError(f"{where}: head_dim={head_dim} x num_attention_heads={arch['n_heads']} != hidden_size="
                          f"{arch['d_model']}; theseus's heads split d_model")
    return arch


def _resolved(arch: Mapping[str, Any], fmt: Format) -> dict[str, Any]:
    """``arch`` with the widths a GPT derives when unset written out: d_ff (4 x d_model) and,
    where config.json holds it, n_kv_heads (n_heads)."""
    out = dict(arch)
    out["d_ff"] = out["d_ff"] or 4 * out["d_model"]
    if "n_kv_heads" in fmt.keys:
        out["n_kv_heads"] = out["n_kv_heads"] or out["n_heads"]
    return out


def expressed(kind: str) -> frozenset[str]:
    """The architecture keys model_type ``kind``'s config.json determines (read, implied or written)."""
    fmt = FORMATS[kind]
    return frozenset(fmt.keys) | frozenset(fmt.implied) | frozenset(fmt.written.values())


def _matches(arch: Mapping[str, Any], fmt: Format) -> bool:
    if ("moe.n_experts" in arch) != (fmt.model == "moe"):
        return False
    given = {**arch, "n_kv_heads": None if arch["n_kv_heads"] in (None, arch["n_heads"]) else arch["n_kv_heads"]}
    return all(given.get(key) == value for key, value in fmt.implied.items())


def model_type(arch: Mapping[str, Any]) -> str:
    """The Hugging Face model_type that computes what ``arch`` does; ConfigError when none does."""
    for fmt in FORMATS.values():
        if _matches(arch, fmt):
            return fmt.model_type
    model = "moe" if "moe.n_experts" in arch else "gpt"
    shown = sorted({key for fmt in FORMATS.values() if fmt.model == model for key in fmt.implied})
    layouts = "; ".join(f"{fmt.model_type}: " + " ".join(f"{k}={_shown(v)}" for k, v in fmt.implied.items())
                        for fmt in FORMATS.values() if fmt.model == model)
    raise ConfigError(f"architecture {' '.join(f'{k}={_shown(arch.get(k))}' for k in shown)} has no Hugging Face "
                      f"model_type: export writes {layouts}")


def _shown(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def hf_config(arch: Mapping[str, Any], vocab_size: int, special: Mapping[str, int | None],
              dtype: str = "float32") -> dict[str, Any]:
    """The config.json of ``arch`` with ``vocab_size`` rows; ``special``: the ids of SPECIAL_TOKENS
    (an imported checkpoint's own, or the tokenizer's end-of-text); ``dtype``: the tensors'."""
    fmt = FORMATS[model_type(arch)]
    values = _resolved(arch, fmt)
    config = {"model_type": fmt.model_type, "architectures": [fmt.architectures],
              **{key: allowed[0] for key, allowed in fmt.required.items()}, **fmt.constants,
              **{name: values[key] for key, (name, _) in fmt.keys.items()},
              **{name: values[key] for name, key in fmt.written.items()},
              "vocab_size": vocab_size, **{key: special.get(key) for key in SPECIAL_TOKENS}, "dtype": dtype}
    if ROPE_THETA in config:
        config["rope_parameters"] = {"rope_type": "default", ROPE_THETA: config[ROPE_THETA]}
        config["head_dim"] = values["d_model"] // values["n_heads"]
    return config


def arch_of(model: Any) -> dict[str, Any]:
    """The architecture values of a built model (every ``architecture.*`` key of its component
    tree, without the prefix), as ``hf_config`` and hf_weights take them."""
    values = model.own_configuration()
    schema = {key: spec for key, spec in schema_of(type(model)).items() if key.startswith("architecture.")}
    given = {key: values.get(key) for key in schema}
    return {key.removeprefix("architecture."): spec.default if given[key] is MISSING else given[key]
            for key, spec in schema.items()}
