"""LoRA adapters in peft's format: ``adapter_config.json`` and ``adapter_model.safetensors``.

    tensors = adapter_tensors("llama", params)   # unrolled params with lora_* adapters
    save_adapter(out_dir, tensors, adapter_config("llama", settings, base="/path/to/hf/folder"))

``peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out_dir)`` then
computes what the merged export computes. peft's keys are ``base_model.model.<module>.lora_A.weight``
(``[rank, in]``) and ``.lora_B.weight`` (``[out, rank]``), with the Hugging Face module path of
the adapted projection; a key without the ``base_model.model.`` prefix would be ignored (peft
keeps its own zero B). GPT-2 fuses q, k and v in ``c_attn``: theseus's ``lora_qkv`` is one
adapter there, its B the three B's stacked; its ``Conv1D`` weights are ``[in, out]``
(``fan_in_fan_out``). Phi-3 fuses them in ``qkv_proj`` and gate and up in ``gate_up_proj``
(``lora_qkv``, ``lora_gateup``: ``architecture.fused_projections``, which a Phi-3 import sets).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flax import traverse_util

from theseus.config import ConfigError
from theseus.data.safetensors_file import write_safetensors
from theseus.interop.hf_weights import GPT2_PREFIX
from theseus.model.lora import EXPERT, GROUPS, PREFIX, LoRA, is_adapter

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
_GPT2 = {"qkv": "attn.c_attn", "o": "attn.c_proj", "up": "mlp.c_fc", "down": "mlp.c_proj"}
_LLAMA = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
          "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
_PHI3 = {"qkv": "self_attn.qkv_proj", "o": "self_attn.o_proj", "gateup": "mlp.gate_up_proj", "down": "mlp.down_proj"}
# model_type -> (its layers' module prefix, theseus adapter -> the module it adapts in a layer)
MODULES = {"gpt2": (f"{GPT2_PREFIX}h", _GPT2), "phi3": ("model.layers", _PHI3),
           **dict.fromkeys(("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "mixtral", "qwen2_moe"),
                           ("model.layers", _LLAMA))}
_ADAPTER = re.compile(r"h_(\d+)/(attn|mlp)/" + PREFIX + r"(\w+)")


def adapter_tensors(model_type: str, params: Mapping) -> dict[str, np.ndarray]:
    """peft's tensors of the adapters in ``params`` (unrolled: ``h_0/attn/lora_q/a``), float32."""
    layers, modules = MODULES[model_type]
    flat = {path: np.asarray(leaf, np.float32) for path, leaf in traverse_util.flatten_dict(params, sep="/").items()
            if is_adapter(path)}
    out = {}
    for path in sorted({p.rsplit("/", 1)[0] for p in flat}):
        match = _ADAPTER.fullmatch(path)
        if match is None or (match[3] not in modules and not match[3].startswith(EXPERT)):
            raise ConfigError(f"adapter {path} has no place in a Hugging Face {model_type} model ({_why(model_type)}; "
                              f"architecture.fused_projections fuses them): export it merged (without --adapter)")
        layer, name = int(match[1]), match[3]
        if name.startswith(EXPERT):
            raise ConfigError(f"--adapter: adapter {path} adapts a mixture's experts, which peft's LoRA format does "
                              f"not hold as theseus trains them (one A and B per expert and projection): export it "
                              f"merged (without --adapter)")
        a = flat[f"{path}/a"]
        rank = a.shape[-1]
        bs = [flat[f"{path}/b_{t}"] for t in GROUPS[name]] if name in GROUPS else [flat[f"{path}/b"]]
        module = f"{PEFT_PREFIX}{layers}.{layer}.{modules[name]}"
        out[f"{module}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, rank).T)
        out[f"{module}.lora_B.weight"] = np.ascontiguousarray(np.concatenate([b.reshape(rank, -1) for b in bs], 1).T)
    return out


def _why(model_type: str) -> str:
    """What a model_type's adapters are: its modules, as theseus's targets name them."""
    return "its adapters: " + ", ".join(f"{'+'.join(GROUPS.get(name, (name,)))} ({module})"
                                        for name, module in MODULES[model_type][1].items())


def adapter_config(model_type: str, settings: LoRA, tensors: Mapping[str, np.ndarray], base: str) -> dict[str, Any]:
    """peft's ``LoraConfig`` of ``tensors`` (their modules are its targets), against the folder ``base``."""
    layers = re.escape(f"{PEFT_PREFIX}{MODULES[model_type][0]}.")
    modules = sorted({re.fullmatch(layers + r"\d+\.(.+)\.lora_[AB]\.weight", name)[1] for name in tensors})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": settings.rank,
            "lora_alpha": settings.alpha, "lora_dropout": settings.dropout, "target_modules": modules,
            "fan_in_fan_out": model_type == "gpt2", "bias": "none", "use_rslora": False, "use_dora": False,
            "init_lora_weights": True, "inference_mode": True, "modules_to_save": None}


def save_adapter(out_dir: Path, tensors: Mapping[str, np.ndarray], config: Mapping[str, Any]) -> None:
    """Write ``out_dir/adapter_config.json`` and ``adapter_model.safetensors``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    write_safetensors(tensors, out_dir / WEIGHTS_FILE)
