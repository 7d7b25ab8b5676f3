"""A Hugging Face ``config.json`` <-> theseus's ``architecture.*`` values, one table per ``model_type``.

    hf = read_config(folder)          # the folder's config.json, as a dict
    arch = architecture(hf)           # {"n_layers": 12, "d_model": 768, ...}: architecture.* keys
    hf_again = hf_config(arch, vocab_size=50257, special={"eos_token_id": 50256})
    merged = hf_config(arch, 50257, special, base=hf)  # a fine-tune of hf: its other fields kept

Each ``Format`` declares, for one model_type, which config.json key holds each architecture key
(read on import, written on export), the architecture values the model_type implies (its layout:
set on import, matched on export) and the config.json values theseus computes (checked on
import, written on export). Only what theseus computes exactly is accepted: GPT-2 (``gpt2``),
Llama (``llama``, Llama 3.x's ``llama3`` RoPE scaling and ``linear`` included, as for every
RoPE family), Qwen2 (``qwen2``: Llama's layout with biases on q, k and v), Qwen3 (``qwen3``: q/k
norms, heads of their own width), Mistral (``mistral``: a sliding window), Phi-3 (``phi3``:
q, k, v and gate, up stored fused), Gemma 2 and 3 (``gemma2``, ``gemma3_text``: scaled
embeddings, ``1 + w`` RMSNorms around attention and MLP, GeGLU, soft-capped scores and logits,
sliding and global layers, Gemma 3's q/k norms and local RoPE base), and with ``model=moe``
Mixtral (``mixtral``: top-k experts, renormalised) and Qwen2-MoE (``qwen2_moe``: experts plus a
sigmoid-gated shared expert), both dropless. Anything else (``yarn`` or ``longrope`` RoPE
scaling, partial rotary, Qwen's windows over some layers, Llama's attention biases, Qwen2-MoE's
``mlp_only_layers``) is refused in one line rather than imported approximately.
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
    read; ``model``: the theseus model (``model=...``) that computes it; ``settings``: values an
    import sets that do not change what is computed (not matched on export: Phi-3's LoRA adapters
    fused as its projections are). ``rope_theta``: the RoPE
    base transformers defaults to (None: no RoPE), its parameters read from ``rope_parameters``
    (or ``rope_scaling``), one set per layer type where ``local_rope_theta`` (the sliding layers'
    default base) is set: Gemma 3's. ``layer_types``: config.json's ``layer_types`` (else a
    ``sliding_window_pattern`` of ``pattern``) says which layers slide (``architecture.global_every``).
    """

    model_type: str
    architectures: str
    keys: dict[str, tuple[str, Any]]
    implied: dict[str, Any]
    required: dict[str, tuple] = field(default_factory=dict)
    written: dict[str, str] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)
    model: str = "gpt"
    settings: dict[str, Any] = field(default_factory=dict)
    rope_theta: float | None = 10000.0
    local_rope_theta: float | None = None
    layer_types: bool = False
    pattern: int = 0


ROPE_THETA = "rope_theta"  # in rope_parameters (transformers 5) or at the top level (4): both are written
ROPE_KEYS = ("rope_theta", "rope_scaling.type", "rope_scaling.factor", "rope_scaling.low_freq_factor",
             "rope_scaling.high_freq_factor", "rope_scaling.original_seq_len")
# each RoPE scaling theseus computes: its rope_type, and its parameters' config.json names
SCALINGS = {"linear": {"factor": "factor"},
            "llama3": {"factor": "factor", "low_freq_factor": "low_freq_factor",
                       "high_freq_factor": "high_freq_factor", "original_seq_len": "original_max_position_embeddings"}}
SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' layer types
# the layout keys a family may set, at the values that change nothing (a Format implies these unless it reads them)
_PLAIN = {"qk_norm": False, "post_norms": False, "scale_embeddings": False, "attn_softcap": None,
          "logit_softcap": None, "attn_scale_dim": None, "sliding_window": None, "global_every": 0,
          "rope_theta_local": None}
_LLAMA_LAYOUT = {"bias": False, "norm": "rmsnorm", "activation": "swiglu", "positions": "rope"}


def _implied(keys: dict[str, tuple[str, Any]], read: tuple[str, ...] = (), **values: Any) -> dict[str, Any]:
    """A Format's implied values: ``values`` over the plain layout, less what it reads (its
    ``keys``, and ``read``: the keys ``architecture`` derives from config.json otherwise)."""
    return {key: value for key, value in {**_PLAIN, **values}.items() if key not in keys and key not in read}


def _llama_keys(vocab: int, seq: int, d: int, layers: int, heads: int, kv: int | None, d_ff: int, eps: float,
                head_dim: int | None = None, tied: bool = False) -> dict[str, tuple[str, Any]]:
    """The config.json keys Llama and its descendants share (transformers' defaults differ)."""
    return {"vocab_size": ("vocab_size", vocab), "seq_len": ("max_position_embeddings", seq),
            "n_layers": ("num_hidden_layers", layers), "d_model": ("hidden_size", d),
            "n_heads": ("num_attention_heads", heads), "n_kv_heads": ("num_key_value_heads", kv),
            "head_dim": ("head_dim", head_dim), "d_ff": ("intermediate_size", d_ff), "norm_eps": ("rms_norm_eps", eps),
            "tie_embeddings": ("tie_word_embeddings", tied)}


_NO_DROPOUT = {"attention_dropout": 0.0}
_MOE = {"moe.n_experts": ("num_experts", 60), "moe.top_k": ("num_experts_per_tok", 4),
        "moe.aux_loss": ("router_aux_loss_coef", 0.001)}
_SILU = {"hidden_act": ("silu",)}
_GEMMA_LAYOUT = {"bias": False, "qkv_bias": False, "norm": "rmsnorm_offset", "activation": "geglu",
                 "positions": "rope", "post_norms": True, "scale_embeddings": True}
_GEMMA_REQUIRED = {"hidden_activation": ("gelu_pytorch_tanh",), "attention_bias": (False,),
                   "use_bidirectional_attention": (None, False), "attention_dropout": (0.0,)}


def _gemma_keys(softcaps: tuple[float | None, float | None], seq: int, vocab: int) -> dict[str, tuple[str, Any]]:
    """Gemma 2's and 3's config.json keys: Llama's, a window, the scores' scale and soft-caps."""
    return {**_llama_keys(vocab, seq, 2304, 26, 8, 4, 9216, 1e-6, head_dim=256, tied=True),
            "sliding_window": ("sliding_window", 4096), "attn_scale_dim": ("query_pre_attn_scalar", 256),
            "attn_softcap": ("attn_logit_softcapping", softcaps[0]),
            "logit_softcap": ("final_logit_softcapping", softcaps[1])}


_KEYS = {
    "llama": _llama_keys(32000, 2048, 4096, 32, 32, None, 11008, 1e-6),
    "qwen2": _llama_keys(151936, 32768, 4096, 32, 32, None, 22016, 1e-6),
    "qwen3": _llama_keys(151936, 32768, 4096, 32, 32, 32, 22016, 1e-6, head_dim=128),
    "mistral": {**_llama_keys(32000, 131072, 4096, 32, 32, 8, 14336, 1e-6),
                "sliding_window": ("sliding_window", 4096)},
    "phi3": {**_llama_keys(32064, 4096, 3072, 32, 32, None, 8192, 1e-5), "sliding_window": ("sliding_window", None)},
    "gemma2": _gemma_keys((50.0, 30.0), 8192, 256000),
    "gemma3_text": _gemma_keys((None, None), 131072, 262208),
    "mixtral": {**_llama_keys(32000, 131072, 4096, 32, 32, 8, 14336, 1e-5),
                "sliding_window": ("sliding_window", None), "moe.n_experts": ("num_local_experts", 8),
                "moe.top_k": ("num_experts_per_tok", 2), "moe.aux_loss": ("router_aux_loss_coef", 0.001)},
    "qwen2_moe": {**_llama_keys(151936, 32768, 2048, 24, 16, None, 5632, 1e-6), **_MOE,
                  "moe.d_ff": ("moe_intermediate_size", 1408),
                  "moe.shared_d_ff": ("shared_expert_intermediate_size", 5632),
                  "moe.norm_topk_prob": ("norm_topk_prob", False), "moe.every": ("decoder_sparse_step", 1)},
}

FORMATS: dict[str, Format] = {f.model_type: f for f in (
    Format("gpt2", "GPT2LMHeadModel",
           keys={"vocab_size": ("vocab_size", 50257), "seq_len": ("n_positions", 1024), "n_layers": ("n_layer", 12),
                 "d_model": ("n_embd", 768), "n_heads": ("n_head", 12), "d_ff": ("n_inner", None),
                 "norm_eps": ("layer_norm_epsilon", 1e-5), "tie_embeddings": ("tie_word_embeddings", True)},
           implied=_implied({}, n_kv_heads=None, bias=True, qkv_bias=False, norm="layernorm", activation="gelu",
                            positions="learned"),
           required={"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "scale_attn_weights": (True,),
                     "scale_attn_by_inverse_layer_idx": (False,)},
           written={"resid_pdrop": "dropout", "embd_pdrop": "dropout"}, constants={"attn_pdrop": 0.0},
           rope_theta=None),
    Format("llama", "LlamaForCausalLM", keys=_KEYS["llama"], implied=_implied(_KEYS["llama"], **_LLAMA_LAYOUT,
                                                                              qkv_bias=False),
           required={**_SILU, "attention_bias": (False,), "mlp_bias": (False,), "attention_dropout": (0.0,)}),
    Format("qwen2", "Qwen2ForCausalLM", keys=_KEYS["qwen2"],
           implied=_implied(_KEYS["qwen2"], **_LLAMA_LAYOUT, qkv_bias=True),
           required={**_SILU, "use_sliding_window": (False,)}, constants=_NO_DROPOUT),
    Format("qwen3", "Qwen3ForCausalLM", keys=_KEYS["qwen3"],
           implied=_implied(_KEYS["qwen3"], **_LLAMA_LAYOUT, qkv_bias=False, qk_norm=True),
           required={**_SILU, "attention_bias": (False,), "use_sliding_window": (False,), "attention_dropout": (0.0,)}),
    Format("mistral", "MistralForCausalLM", keys=_KEYS["mistral"],
           implied=_implied(_KEYS["mistral"], **_LLAMA_LAYOUT, qkv_bias=False), required=_SILU,
           constants=_NO_DROPOUT),
    Format("phi3", "Phi3ForCausalLM", keys=_KEYS["phi3"], implied=_implied(_KEYS["phi3"], **_LLAMA_LAYOUT,
                                                                           qkv_bias=False),
           required=_SILU, written={"resid_pdrop": "dropout", "embd_pdrop": "dropout"}, constants=_NO_DROPOUT,
           settings={"fused_projections": True}),  # Llama's computation: its imports export as phi3 (a base's type)
    Format("gemma2", "Gemma2ForCausalLM", keys=_KEYS["gemma2"],
           implied=_implied(_KEYS["gemma2"], ("global_every",), **_GEMMA_LAYOUT),
           required=_GEMMA_REQUIRED, layer_types=True, pattern=2),
    Format("gemma3_text", "Gemma3ForCausalLM", keys=_KEYS["gemma3_text"],
           implied=_implied(_KEYS["gemma3_text"], ("global_every", "rope_theta_local"), **_GEMMA_LAYOUT, qk_norm=True),
           required=_GEMMA_REQUIRED,
           rope_theta=1000000.0, local_rope_theta=10000.0, layer_types=True, pattern=6),
    Format("mixtral", "MixtralForCausalLM", keys=_KEYS["mixtral"],
           implied=_implied(_KEYS["mixtral"], **_LLAMA_LAYOUT, qkv_bias=False, **{
               "moe.norm_topk_prob": True, "moe.capacity_factor": None, "moe.d_ff": None, "moe.shared_d_ff": 0,
               "moe.shared_gate": False, "moe.every": 1}),
           required=_SILU, constants=_NO_DROPOUT, model="moe", rope_theta=1000000.0),
    Format("qwen2_moe", "Qwen2MoeForCausalLM", keys=_KEYS["qwen2_moe"],
           implied=_implied(_KEYS["qwen2_moe"], **_LLAMA_LAYOUT, qkv_bias=True,
                            **{"moe.capacity_factor": None, "moe.shared_gate": True}),
           required={**_SILU, "use_sliding_window": (False,), "qkv_bias": (True,), "mlp_only_layers": ([],)},
           constants=_NO_DROPOUT, model="moe"),
)}
SUPPORTED = tuple(FORMATS)


def read_config(folder: Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict (a Hugging Face folder: ``theseus.sources`` found
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
    arch = {**fmt.implied, **fmt.settings}
    for key, (name, default) in fmt.keys.items():
        arch[key] = hf.get(name, default)
    _check_heads(arch, fmt, where)
    arch = _resolved(arch, fmt)
    arch["norm_eps"] = float(arch["norm_eps"])
    for key in ("attn_softcap", "logit_softcap"):
        if arch.get(key) is not None:
            arch[key] = float(arch[key])
    return {**arch, **_rope(hf, fmt, where), **_layers(hf, fmt, arch, where)}


def _check_heads(arch: Mapping[str, Any], fmt: Format, where: str) -> None:
    """ConfigError, in config.json's names, for attention heads that do not divide: the query
    heads the hidden size (unless a head_dim gives their width), the key/value heads the query heads."""
    name = {key: config_key for key, (config_key, _) in fmt.keys.items()}
    d, heads, kv = arch["d_model"], arch["n_heads"], arch.get("n_kv_heads")
    for key, value in (("n_heads", heads), ("n_kv_heads", kv)):
        if key in name and value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"{where}: {name[key]}={value!r} must be a positive integer")
    if arch.get("head_dim") is None and d % heads:
        width = " (or give the heads' width, head_dim)" if "head_dim" in name else ""
        raise ConfigError(f"{where}: {name['n_heads']}={heads} does not divide {name['d_model']}={d}: fix "
                          f"config.json{width}")
    if kv and heads % kv:
        raise ConfigError(f"{where}: {name['n_kv_heads']}={kv} does not divide {name['n_heads']}={heads} (each "
                          f"key/value head serves a whole group of query heads): fix config.json")


def _rope(hf: Mapping[str, Any], fmt: Format, where: str) -> dict[str, Any]:
    """The RoPE keys of a config.json: its base and scaling (``rope_parameters``, transformers
    5's, or ``rope_theta`` and ``rope_scaling``, 4's: ``rope_scaling`` wins, as transformers reads
    it), and with per-layer-type parameters (Gemma 3), the sliding layers' base."""
    if fmt.rope_theta is None:
        return {}
    given = dict(hf.get("rope_parameters") or {})
    if fmt.local_rope_theta is None:
        full, local = dict(hf.get("rope_scaling") or given), None
    else:
        full = {**(given.get(FULL) or {}), **(hf.get("rope_scaling") or {})}
        local = given.get(SLIDING) or {}
    out = {ROPE_THETA: float(full.get(ROPE_THETA, hf.get(ROPE_THETA, fmt.rope_theta)))}
    partial = float(full.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise ConfigError(f"{where}: partial_rotary_factor={partial} is not supported (theseus rotates every feature "
                          f"of a head)")
    out.update(_scaling(full, where))
    if local is not None:
        if _scaling(local, where)["rope_scaling.type"] != "none":
            raise ConfigError(f"{where}: RoPE scaling of the {SLIDING} layers is not supported (theseus scales the "
                              f"{FULL} layers' alone)")
        out["rope_theta_local"] = float(local.get(ROPE_THETA, hf.get("rope_local_base_freq", fmt.local_rope_theta)))
    return out


def _scaling(params: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``architecture.rope_scaling.*`` of one set of RoPE parameters; ConfigError for a scaling
    theseus does not compute."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return {"rope_scaling.type": "none"}
    if kind not in SCALINGS:
        raise ConfigError(f"{where}: RoPE scaling {kind!r} is not supported (theseus computes "
                          f"{', '.join(SCALINGS)} and the default, unscaled RoPE)")
    missing = [name for name in SCALINGS[kind].values() if params.get(name) is None]
    if missing:
        raise ConfigError(f"{where}: RoPE scaling {kind!r} has no {missing[0]}: give it in rope_parameters")
    field_type = {"original_seq_len": int}
    return {"rope_scaling.type": kind, **{f"rope_scaling.{key}": field_type.get(key, float)(params[name])
                                          for key, name in SCALINGS[kind].items()}}


def _layers(hf: Mapping[str, Any], fmt: Format, arch: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``architecture.global_every`` of a format whose ``layer_types`` (or, without them, its
    ``sliding_window_pattern``) say which layers slide; ConfigError when they do not alternate
    as every N-th layer global (the others sliding) does."""
    if not fmt.layer_types:
        return {}
    if arch["sliding_window"] is None:
        return {"global_every": 0}
    n = arch["n_layers"]
    pattern = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", fmt.pattern))
    types = list(hf.get("layer_types") or layer_types(n, pattern))
    every = next((i + 1 for i, kind in enumerate(types) if kind == FULL), 0)
    if types != layer_types(n, every):
        raise ConfigError(f"{where}: layer_types {types} do not alternate as every N-th layer global does "
                          f"(architecture.global_every): theseus computes those")
    return {"global_every": every}


def layer_types(n_layers: int, global_every: int) -> list[str]:
    """transformers' ``layer_types``: every ``global_every``-th layer full, the others sliding."""
    return [FULL if global_every and (i + 1) % global_every == 0 else SLIDING for i in range(n_layers)]


def _resolved(arch: Mapping[str, Any], fmt: Format) -> dict[str, Any]:
    """``arch`` with the widths a GPT derives when unset written out: d_ff (4 x d_model) and,
    where config.json holds them, n_kv_heads (n_heads) and head_dim (d_model / n_heads)."""
    out = dict(arch)
    out["d_ff"] = out["d_ff"] or 4 * out["d_model"]
    if "n_kv_heads" in fmt.keys:
        out["n_kv_heads"] = out["n_kv_heads"] or out["n_heads"]
    if "head_dim" in fmt.keys:
        out["head_dim"] = out["head_dim"] or out["d_model"] // out["n_heads"]
    return out


def expressed(kind: str) -> frozenset[str]:
    """The architecture keys model_type ``kind``'s config.json determines (read, implied or written)."""
    fmt = FORMATS[kind]
    rope = (*ROPE_KEYS, *(("rope_theta_local",) if fmt.local_rope_theta is not None else ())) if fmt.rope_theta else ()
    return (frozenset(fmt.keys) | frozenset(fmt.implied) | frozenset(fmt.written.values()) | frozenset(rope)
            | frozenset(fmt.settings) | frozenset(("global_every",) if fmt.layer_types else ()))


def _matches(arch: Mapping[str, Any], fmt: Format) -> bool:
    if ("moe.n_experts" in arch) != (fmt.model == "moe"):
        return False
    given = {**arch, "n_kv_heads": None if arch["n_kv_heads"] in (None, arch["n_heads"]) else arch["n_kv_heads"]}
    return all(given.get(key) == value for key, value in fmt.implied.items())


def model_type(arch: Mapping[str, Any], prefer: str | None = None) -> str:
    """The Hugging Face model_type that computes what ``arch`` does (``prefer``, when it does: the
    model_type a run was imported from); ConfigError when none does."""
    for fmt in ([FORMATS[prefer]] if prefer in FORMATS else []) + list(FORMATS.values()):
        if _matches(arch, fmt):
            return fmt.model_type
    model = "moe" if "moe.n_experts" in arch else "gpt"
    shown = sorted({key for fmt in FORMATS.values() if fmt.model == model for key in fmt.implied
                    if key not in _PLAIN or arch.get(key) != _PLAIN[key]})
    layouts = "; ".join(f"{fmt.model_type}: " + " ".join(f"{k}={_shown(v)}" for k, v in fmt.implied.items()
                                                         if k in shown)
                        for fmt in FORMATS.values() if fmt.model == model)
    raise ConfigError(f"architecture {' '.join(f'{k}={_shown(arch.get(k))}' for k in shown)} has no Hugging Face "
                      f"model_type: export writes {layouts}")


def _shown(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def hf_config(arch: Mapping[str, Any], vocab_size: int, special: Mapping[str, int | None],
              dtype: str = "float32", base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The config.json of ``arch`` with ``vocab_size`` rows; ``special``: the ids of SPECIAL_TOKENS
    (an imported checkpoint's own, or the tokenizer's end-of-text); ``dtype``: the tensors'.

    ``base``: the config.json of the Hugging Face folder the run started from. Its model_type is
    kept where it computes ``arch``, and every field theseus does not write stays as it was
    (rope scaling, token ids, fields theseus does not read); so does its
    ``max_position_embeddings`` with RoPE, where ``architecture.seq_len`` is only the context a
    fine-tune trained at (learned positions' table has seq_len rows)."""
    fmt = FORMATS[model_type(arch, prefer=(base or {}).get("model_type"))]
    values = _resolved(arch, fmt)
    config = {"model_type": fmt.model_type, "architectures": [fmt.architectures],
              **{key: allowed[0] for key, allowed in fmt.required.items()}, **fmt.constants,
              **{name: values[key] for key, (name, _) in fmt.keys.items()},
              **{name: values[key] for name, key in fmt.written.items()},
              "vocab_size": vocab_size, **{key: special.get(key) for key in SPECIAL_TOKENS}, "dtype": dtype,
              **_rope_config(values, fmt)}
    if fmt.layer_types:  # without a window, every layer global
        config["layer_types"] = layer_types(values["n_layers"], values["global_every"] if values["sliding_window"] else 1)
    if base is None or base.get("model_type") != fmt.model_type:
        return config
    context = fmt.keys["seq_len"][0]
    if values["positions"] == "rope" and context in base:
        config[context] = base[context]
    return {**{key: value for key, value in base.items() if key not in DROPPED}, **config,
            **({"torch_dtype": dtype} if "torch_dtype" in base else {})}


DROPPED = ("quantization_config",)  # base fields that do not describe the export's plain tensors


def _rope_config(values: Mapping[str, Any], fmt: Format) -> dict[str, Any]:
    """The RoPE entries of a config.json: ``rope_parameters`` (per layer type for Gemma 3) and,
    for transformers 4, ``rope_theta``."""
    if fmt.rope_theta is None:
        return {}
    kind = values["rope_scaling.type"]
    full = {"rope_type": "default" if kind == "none" else kind, ROPE_THETA: values[ROPE_THETA],
            **{name: values[f"rope_scaling.{key}"] for key, name in SCALINGS.get(kind, {}).items()}}
    if fmt.local_rope_theta is None:
        return {ROPE_THETA: values[ROPE_THETA], "rope_parameters": full}
    local = full if values["rope_theta_local"] is None else {"rope_type": "default",
                                                              ROPE_THETA: values["rope_theta_local"]}
    return {"rope_parameters": {FULL: full, SLIDING: local}}


def arch_of(model: Any) -> dict[str, Any]:
    """The architecture values of a built model (every ``architecture.*`` key of its component
    tree, without the prefix), as ``hf_config`` and hf_weights take them."""
    values = model.own_configuration()
    schema = {key: spec for key, spec in schema_of(type(model)).items() if key.startswith("architecture.")}
    given = {key: values.get(key) for key in schema}
    return {key.removeprefix("architecture."): spec.default if given[key] is MISSING else given[key]
            for key, spec in schema.items()}
