"""GGUF files as a model source: the config.json their metadata describes and their tensors by
Hugging Face name, so that every Hugging Face table (``hf_config``'s Formats, ``hf_weights``'
Rules, ``loading``) reads a GGUF file as it reads a folder.

    hf = config(path)                            # {"model_type": "llama", "hidden_size": 576, ...}
    with Tensors(path) as checkpoint:     # hf_weights.Checkpoint's protocol
        wq = checkpoint.read("model.layers.0.self_attn.q_proj.weight")   # float32 [out, in]

The config is what llama.cpp computes from the file, in the terms transformers' GGUF loader
(``from_pretrained(folder, gguf_file=...)``) uses: ``general.architecture`` gives the model_type
(``llama``, ``qwen2``, ``qwen3``, ``phi3``, ``gemma2``, ``gemma3``; llama.cpp's converter writes a
Mistral as a ``llama`` file without its window, and llama.cpp reads it so), the
``ARCH.*`` keys its sizes, windows, soft-caps and RoPE bases, the tokenizer its vocabulary and
special ids, the absence of an ``output.weight`` tied embeddings. Where transformers' loader
ignores a key llama.cpp reads (Gemma's soft-caps, Gemma 3's local RoPE base, a ``linear`` RoPE
factor) or assumes what llama.cpp does not (Gemma's query scale), the config follows llama.cpp,
whose computation the file was written for. Llama 3.1's ``rope_freqs.weight``
(each RoPE frequency's divisor) becomes the ``llama3`` RoPE scaling that gives those divisors.

A tensor is named as llama.cpp names it (``blk.0.attn_q.weight``), found through the gguf
package's own name map, dequantised to float32 when read (one at a time: the host never holds the
model dequantised) and put back as transformers holds it: a Llama's q and k rows in Hugging Face's
rotary layout (llama.cpp's converter interleaves each head's two rotary halves), Gemma's RMSNorm
gains less the 1 the converter added.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from theseus.config import ConfigError
from theseus.data.gguf_file import GGUFFile, open_gguf
from theseus.data.gguf_tokenizer import NAMED, PREFIX
from theseus.interop.hf_config import FULL, SCALINGS, SLIDING, SPECIAL_TOKENS
from theseus.model.layers import RoPE

_SIZES = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
          "embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
          "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
          "attention.key_length": "head_dim", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
          "rope.freq_base": "rope_theta", "vocab_size": "vocab_size"}  # llama.cpp's ARCH.* keys -> config.json's
_GEMMA = {**_SIZES, "attention.sliding_window": "sliding_window",
          "attention.sliding_window_pattern": "sliding_window_pattern",
          "final_logit_softcapping": "final_logit_softcapping"}


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One llama.cpp ``general.architecture``: its Hugging Face ``model_type``, which ``ARCH.*``
    metadata keys give which config.json keys, whether llama.cpp's converter permuted the rows of
    q and k (Llama's) and what it added to every RMSNorm gain (Gemma's 1). ``largest``: Gemma's
    layer count of its 27B model, whose queries llama.cpp scales by ``d_model / heads`` (every other
    size's by its head width): transformers' ``query_pre_attn_scalar``, which no GGUF key holds."""

    model_type: str
    keys: Mapping[str, str] = dataclasses.field(default_factory=lambda: _SIZES)
    permuted: bool = False
    norm_offset: float = 0.0
    largest: int | None = None

    def derived(self, hf: Mapping[str, Any], head_dim: int) -> dict[str, Any]:
        """The config.json values no key of the file holds: Gemma's query scale."""
        if self.largest is None:
            return {}
        largest = hf["num_hidden_layers"] == self.largest
        return {"query_pre_attn_scalar": hf["hidden_size"] // hf["num_attention_heads"] if largest else head_dim}


ARCHITECTURES = {
    "llama": Architecture("llama", permuted=True),
    "qwen2": Architecture("qwen2"),
    "qwen3": Architecture("qwen3"),
    "phi3": Architecture("phi3"),  # its window not read: llama.cpp computes Phi-3 without one
    "gemma2": Architecture("gemma2", {**_GEMMA, "attn_logit_softcapping": "attn_logit_softcapping"},
                           norm_offset=1.0, largest=46),
    "gemma3": Architecture("gemma3_text", {**_GEMMA, "rope.freq_base_swa": "rope_local_base_freq"},
                           norm_offset=1.0, largest=62),
}
ROPE_FACTORS = "rope_freqs.weight"  # Llama 3.1's RoPE scaling, stored as per-frequency divisors
LONGROPE = "rope_factors_long.weight"  # Phi-3's 128k-context RoPE scaling
# the converter's llama3 parameters besides the factor (Llama 3.x's), under theseus's RoPE field names
LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_seq_len": 8192}


def config(path: str | Path) -> dict[str, Any]:
    """The config.json dict the GGUF file at ``path`` describes (what ``hf_config.architecture``
    reads; it refuses what theseus does not compute). ConfigError for an architecture theseus
    does not read, a mixture of experts, a split file, or RoPE scaling no config.json describes."""
    file = open_gguf(path)
    meta, arch = file.metadata, _architecture(file)
    if meta.get("split.count", 1) > 1:
        raise ConfigError(f"{file.path} is one of {meta['split.count']} parts of a GGUF model: merge them into one file "
                          f"(llama-gguf-split --merge) and give that")
    name = meta["general.architecture"]
    if meta.get(f"{name}.expert_count", 0):
        raise ConfigError(f"{file.path}: a mixture of experts in a GGUF file ({name}.expert_count="
                          f"{meta[f'{name}.expert_count']}) is not supported: theseus reads dense GGUF models (it "
                          f"imports Mixtral and Qwen2-MoE from Hugging Face folders)")
    hf: dict[str, Any] = {"model_type": arch.model_type,
                          **{hf_key: meta[f"{name}.{key}"] for key, hf_key in arch.keys.items()
                             if f"{name}.{key}" in meta}}
    hf.setdefault("vocab_size", len(meta.get(PREFIX + "tokens") or []) or None)
    hf["tie_word_embeddings"] = "output.weight" not in file.tensors
    hf.update({special: meta.get(PREFIX + NAMED[special.removesuffix("_id")]) for special in SPECIAL_TOKENS})
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]  # llama.cpp's, unless stated
    hf.update(arch.derived(hf, head_dim))
    if hf.get("sliding_window") == 0:  # llama.cpp's "no window"
        hf["sliding_window"] = None
    if isinstance(hf.get("sliding_window_pattern"), list):  # one flag per layer, true where it slides
        hf["layer_types"] = [SLIDING if sliding else FULL for sliding in hf.pop("sliding_window_pattern")]
    scaling = _rope_scaling(file, name, head_dim, hf.get("rope_theta", 10000.0))
    if scaling is not None:
        hf["rope_scaling"] = scaling
    rotary = meta.get(f"{name}.rope.dimension_count")
    if rotary is not None and rotary != head_dim:
        raise ConfigError(f"{file.path}: RoPE over {rotary} of each head's {head_dim} dimensions is not supported "
                          f"(theseus rotates whole heads)")
    return hf


def _rope_scaling(file: GGUFFile, name: str, head_dim: int, theta: float) -> dict[str, Any] | None:
    """The ``rope_scaling`` of a config.json that computes the file's RoPE as llama.cpp does
    (None: unscaled): ``ARCH.rope.scaling.*`` (a factor without a type is ``linear``, as llama.cpp
    reads it), or Llama 3.1's frequency divisors (``rope_freqs.weight``) as the ``llama3`` scaling
    that gives them: its factor the largest divisor, its other parameters the converter's. ConfigError
    for divisors that scaling does not give, Phi-3's longrope factors, or divisors beside a scaling."""
    meta = file.metadata
    kind = meta.get(f"{name}.rope.scaling.type", "linear")
    factor = meta.get(f"{name}.rope.scaling.factor", meta.get(f"{name}.rope.scale_linear"))
    stated = kind != "none" and not (kind == "linear" and factor in (None, 0, 1))
    if LONGROPE in file.tensors:
        raise ConfigError(f"{file.path}: RoPE scaling 'longrope' ({LONGROPE}, Phi-3's long context) is not supported "
                          f"(theseus computes linear and llama3 RoPE scaling)")
    if ROPE_FACTORS not in file.tensors:
        return {"rope_type": kind, "factor": factor} if stated else None
    divisors = file.read(ROPE_FACTORS)
    factor = float(divisors.max())
    expected = np.asarray(RoPE(rope_theta=theta).inv_freq(head_dim)
                          / RoPE(rope_theta=theta, scaling="llama3", factor=factor, **LLAMA3).inv_freq(head_dim))
    if stated or divisors.shape != expected.shape or not np.allclose(divisors, expected, rtol=1e-4, atol=0):
        raise ConfigError(f"{file.path}: RoPE frequency divisors ({ROPE_FACTORS}) other than Llama 3's are not "
                          f"supported (theseus computes llama3 RoPE scaling with low_freq_factor 1, high_freq_factor "
                          f"4 and an original context of 8192, as llama.cpp's converter writes it)")
    if factor == 1:
        return None
    return {"rope_type": "llama3", "factor": factor, **{SCALINGS["llama3"][key]: value
                                                        for key, value in LLAMA3.items()}}


class Tensors:
    """A GGUF file's tensors by Hugging Face name, as ``hf_weights.Checkpoint`` reads a folder's:

        with Tensors(path) as checkpoint:
            checkpoint.read("model.embed_tokens.weight")   # float32 [vocab, d_model]
            checkpoint.unused()                            # GGUF tensors no read asked for
    """

    def __init__(self, path: str | Path):
        self.file = open_gguf(path)
        self.config = config(path)
        self.architecture = _architecture(self.file)
        kind = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}[self.file.metadata["general.architecture"]]
        self.names = gguf.get_tensor_name_map(kind, self.config["num_hidden_layers"])
        self.used: set[str] = {ROPE_FACTORS} & set(self.file.tensors)  # read into the config's RoPE scaling

    def __enter__(self) -> Tensors:
        return self

    def __exit__(self, *exc) -> None:
        """Nothing held open: each read maps its tensor's bytes and lets them go."""

    def read(self, name: str) -> np.ndarray:
        """The tensor transformers names ``name``, dequantised to float32 (q and k of a Llama
        file in Hugging Face's rotary layout, a Gemma RMSNorm's gain less 1); ConfigError naming
        it when the file lacks it."""
        module, _, kind = name.rpartition(".")
        found = self.names.get_name(module)
        tensor = f"{found}.{kind}"
        if found is None or tensor not in self.file.tensors:
            raise ConfigError(f"{self.file.path} has no tensor for {name} ({tensor if found else 'no GGUF name'}): "
                              f"its metadata does not match its tensors")
        self.used.add(tensor)
        value = self.file.read(tensor)
        if self.architecture.permuted and kind == "weight" and found.endswith((".attn_q", ".attn_k")):
            heads = self.config["num_attention_heads" if found.endswith(".attn_q") else "num_key_value_heads"]
            value = unpermute(value, heads)
        if self.architecture.norm_offset and tensor.endswith("norm.weight"):
            value = value - np.float32(self.architecture.norm_offset)
        return value

    def unused(self) -> list[str]:
        """The file's tensors no ``read`` asked for: weights an import would drop."""
        return [name for name in self.file.tensors if name not in self.used]


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """``weight: [heads * head_dim, ...]`` with each head's rows back in Hugging Face's order,
    the inverse of llama.cpp's converter: it stores head rows ``(x0, x1, ..., y0, y1, ...)``
    (the two halves RoPE rotates together) interleaved as ``(x0, y0, x1, y1, ...)``."""
    rows, rest = weight.shape[0], weight.shape[1:]
    return weight.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(weight.shape)


def _architecture(file: GGUFFile) -> Architecture:
    name = file.metadata.get("general.architecture")
    if name not in ARCHITECTURES:
        raise ConfigError(f"{file.path}: a GGUF model of architecture {name!r} is not supported; theseus reads "
                          f"{', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]
