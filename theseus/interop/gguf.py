"""GGUF files as a model source: the config.json their metadata describes and their tensors by
Hugging Face name, so that every Hugging Face table (``hf_config``'s Formats, ``hf_weights``'
Rules, ``loading``) reads a GGUF file as it reads a folder.

    hf = config(path)                            # {"model_type": "llama", "hidden_size": 576, ...}
    with Tensors(path) as checkpoint:     # hf_weights.Checkpoint's protocol
        wq = checkpoint.read("model.layers.0.self_attn.q_proj.weight")   # float32 [out, in]

The config is what transformers' GGUF loader (``from_pretrained(folder, gguf_file=...)``) derives
from the same metadata: ``general.architecture`` gives the model_type, the ``ARCH.*`` keys its
sizes, the tokenizer its vocabulary and special ids, the absence of an ``output.weight`` tied
embeddings. A tensor is named as llama.cpp names it (``blk.0.attn_q.weight``), found through the
gguf package's own name map, dequantised to float32 when read (one at a time: the host never
holds the model dequantised) and, for Llama, its rows put back in Hugging Face's rotary layout:
llama.cpp's converter interleaves each head's two rotary halves in q and k.
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
from theseus.interop.hf_config import SPECIAL_TOKENS

_SIZES = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
          "embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
          "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
          "attention.key_length": "head_dim", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
          "rope.freq_base": "rope_theta", "vocab_size": "vocab_size"}  # llama.cpp's ARCH.* keys -> config.json's


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One llama.cpp ``general.architecture``: its Hugging Face ``model_type``, which ``ARCH.*``
    metadata keys give which config.json keys, and whether llama.cpp's converter permuted the
    rows of q and k (Llama's)."""

    model_type: str
    keys: Mapping[str, str] = dataclasses.field(default_factory=lambda: _SIZES)
    permuted: bool = False


ARCHITECTURES = {"llama": Architecture("llama", permuted=True), "qwen2": Architecture("qwen2")}
ROPE_FACTORS = "rope_freqs.weight"  # Llama 3.1's RoPE scaling, stored as per-frequency divisors


def config(path: str | Path) -> dict[str, Any]:
    """The config.json dict the GGUF file at ``path`` describes (what ``hf_config.architecture``
    reads; it refuses what theseus does not compute). ConfigError for an architecture theseus
    does not read, or RoPE scaling."""
    file = open_gguf(path)
    meta, arch = file.metadata, _architecture(file)
    if meta.get("split.count", 1) > 1:
        raise ConfigError(f"{file.path} is one of {meta['split.count']} parts of a GGUF model: merge them into one file "
                          f"(llama-gguf-split --merge) and give that")
    name = meta["general.architecture"]
    hf: dict[str, Any] = {"model_type": arch.model_type,
                          **{hf_key: meta[f"{name}.{key}"] for key, hf_key in arch.keys.items()
                             if f"{name}.{key}" in meta}}
    hf.setdefault("vocab_size", len(meta.get(PREFIX + "tokens") or []) or None)
    hf["tie_word_embeddings"] = "output.weight" not in file.tensors
    hf.update({special: meta.get(PREFIX + NAMED[special.removesuffix("_id")]) for special in SPECIAL_TOKENS})
    scaling = meta.get(f"{name}.rope.scaling.type", "none")
    if scaling != "none":
        hf["rope_scaling"] = {"rope_type": scaling, "factor": meta.get(f"{name}.rope.scaling.factor")}
    if ROPE_FACTORS in file.tensors:
        raise ConfigError(f"{file.path}: RoPE scaling by frequency factors ({ROPE_FACTORS}, Llama 3.1's) is not "
                          f"supported (theseus's RoPE is the default, unscaled one)")
    rotary = meta.get(f"{name}.rope.dimension_count")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if rotary is not None and rotary != head_dim:
        raise ConfigError(f"{file.path}: RoPE over {rotary} of each head's {head_dim} dimensions is not supported "
                          f"(theseus rotates whole heads)")
    return hf


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
        self.used: set[str] = set()

    def __enter__(self) -> Tensors:
        return self

    def __exit__(self, *exc) -> None:
        """Nothing held open: each read maps its tensor's bytes and lets them go."""

    def read(self, name: str) -> np.ndarray:
        """The tensor transformers names ``name``, dequantised to float32 (q and k of a Llama
        file in Hugging Face's rotary layout); ConfigError naming it when the file lacks it."""
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
