"""Tiny random-weight Hugging Face models, built by transformers itself (nothing downloaded).

Test dependencies: torch (CPU) and transformers.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support import TEXT
from theseus.config import configuration, configure
from theseus.data.tokenizer import HFTokenizer
from theseus.interop.hf_config import architecture, format_of
from theseus.model.models.gpt import GPT
from theseus.model.models.moe_gpt import MoEGPT
from theseus.sources.parse import parse_source

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CORPUS = TEXT


def gpt2_config():
    """GPT-2 with every knob exercised: 4 heads, a vocabulary of 301 (not a multiple of 128)."""
    return transformers.GPT2Config(vocab_size=301, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                                   eos_token_id=None)


def llama_config():
    """Llama with grouped-query attention (4 query heads, 2 kv), untied embeddings, rope_theta
    500000 and a vocabulary of 333."""
    return transformers.LlamaConfig(vocab_size=333, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                    rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                    bos_token_id=None, eos_token_id=None, pad_token_id=None)


def qwen2_config():
    """Qwen2: Llama's layout with biases on q, k and v alone, an rms epsilon of 1e-6 (Qwen2's
    own), grouped-query attention, tied embeddings and a vocabulary of 317."""
    return transformers.Qwen2Config(vocab_size=317, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                    use_sliding_window=False, bos_token_id=None, eos_token_id=None,
                                    pad_token_id=None)


def mixtral_config():
    """Mixtral: 4 experts, top-2 (renormalised), grouped-query attention, a vocabulary of 311."""
    return transformers.MixtralConfig(vocab_size=311, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5,
                                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                                      pad_token_id=None)


def qwen2_moe_config():
    """Qwen2-MoE: 4 experts, top-3 unnormalised, a sigmoid-gated shared expert, q/k/v biases and
    every second layer sparse (the first a dense MLP of another width); a vocabulary of 307."""
    return transformers.Qwen2MoeConfig(vocab_size=307, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       num_experts=4, num_experts_per_tok=3, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=40, norm_topk_prob=False,
                                       decoder_sparse_step=2, tie_word_embeddings=True, bos_token_id=None,
                                       eos_token_id=None, pad_token_id=None)


def llama3_config():
    """Llama 3.x: RoPE scaled as ``llama3`` from a pretraining context of 64 to 128, so that the 8
    feature pairs of a 16-wide head fall in every band (kept, interpolated, divided by the factor)."""
    return transformers.LlamaConfig(vocab_size=329, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 64},
                                    tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def qwen3_config():
    """Qwen3: q/k RMSNorms over heads 32 wide (4 x 32 = 128, twice d_model), grouped-query attention."""
    return transformers.Qwen3Config(vocab_size=313, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                    max_position_embeddings=64, rope_theta=1000000.0, tie_word_embeddings=True,
                                    bos_token_id=None, eos_token_id=None, pad_token_id=None)


def mistral_config():
    """Mistral: a sliding window of 8 (every layer), grouped-query attention."""
    return transformers.MistralConfig(vocab_size=319, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      sliding_window=8, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def phi3_config():
    """Phi-3: q, k, v fused in qkv_proj and gate, up in gate_up_proj; a sliding window of 12."""
    return transformers.Phi3Config(vocab_size=323, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   original_max_position_embeddings=64, sliding_window=12, bos_token_id=None,
                                   eos_token_id=None, pad_token_id=None)


def gemma2_config():
    """Gemma 2: a sliding layer then a global one (window 8), heads 32 wide, scores scaled by
    24 ** -0.5 and soft-capped at 2 (low enough to bend random scores), logits capped at 5."""
    return transformers.Gemma2Config(vocab_size=337, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                     max_position_embeddings=64, query_pre_attn_scalar=24, sliding_window=8,
                                     attn_logit_softcapping=2.0, final_logit_softcapping=5.0, bos_token_id=None,
                                     eos_token_id=None, pad_token_id=None)


def gemma3_config():
    """Gemma 3 (text): q/k norms, a sliding layer (RoPE base 10000) then a global one (base 1e6,
    scaled ``linear`` by 4), window 8, heads 32 wide, scores scaled by 16 ** -0.5."""
    return transformers.Gemma3TextConfig(
        vocab_size=341, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=64, query_pre_attn_scalar=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        bos_token_id=None, eos_token_id=None, pad_token_id=None)


# the families added beside the first five: each model_type's class and tiny config
FAMILIES = {"llama3": ("LlamaForCausalLM", llama3_config), "qwen3": ("Qwen3ForCausalLM", qwen3_config),
            "mistral": ("MistralForCausalLM", mistral_config), "phi3": ("Phi3ForCausalLM", phi3_config),
            "gemma2": ("Gemma2ForCausalLM", gemma2_config), "gemma3": ("Gemma3ForCausalLM", gemma3_config)}


def save_hf(model, folder: Path, tokenizer: bool = True, max_shard_size: str | None = None) -> Path:
    """``model`` with every weight redrawn from N(0, 0.2) (biases and norm scales too, so that
    a mapping that drops or swaps one shows), saved as safetensors (in files of at most
    ``max_shard_size`` with their index, when given) with a BPE tokenizer.json."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.eval().save_pretrained(folder, safe_serialization=True, **({"max_shard_size": max_shard_size}
                                                                     if max_shard_size else {}))
    if tokenizer:
        HFTokenizer.train([CORPUS.read_text()], vocab_size=300).save(folder)
    return folder


def theseus_model(folder: Path, scan_layers: bool = False) -> GPT:
    """The GPT (MoEGPT for a mixture of experts) that folder's config.json (or a GGUF file's
    metadata) describes, computing in float32."""
    hf = parse_source(folder, key=None).hf_config()
    arch = architecture(hf)
    overrides = {f"architecture.{key}": value for key, value in arch.items()}
    with configuration({**overrides, "architecture.dtype.activation": "float32",
                        "architecture.scan_layers": scan_layers}):
        return configure(MoEGPT if format_of(hf).model == "moe" else GPT)


def target_of(model: GPT, seq_len: int = 4) -> dict:
    """The model's params as ShapeDtypeStructs on the first device (what load_params fills)."""
    import flax.linen as nn

    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, seq_len), jnp.int32)))["params"]
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), shapes)


def hf_model(path: Path) -> torch.nn.Module:
    """transformers' model of a Hugging Face folder, or of a GGUF file (its own GGUF loader's,
    dequantised to float32)."""
    if path.suffix == ".gguf":
        return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                 dtype=torch.float32).eval()
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


def hf_logits(folder: Path, tokens: np.ndarray) -> np.ndarray:
    hf = hf_model(folder)
    with torch.no_grad():
        return hf(torch.from_numpy(tokens)).logits.numpy()


def hf_val_loss(folder: Path, overrides: list[str], seq_len: int, batch_size: int, batches: int) -> float:
    """transformers' mean next-token loss of ``folder`` (or GGUF file) over the first ``batches``
    validation batches a theseus run (or evaluation) with these ``data.*`` overrides reads."""
    from theseus.config.compose import with_values
    from theseus.data.config import DataConfig
    from theseus.data.dataset import open_dataset
    from theseus.sources.in_config import init_from_values, init_source

    cfg = parse_source(folder, key=None).config(overrides)
    cfg = with_values(cfg, init_from_values(cfg, init_source(cfg)))
    with configuration(cfg):
        data = configure(DataConfig)
    loader = open_dataset(data).loader("val", seq_len, batch_size, seed=data.seed, prefetch=0)
    hf = hf_model(folder)
    losses = []
    for _ in range(batches):
        batch = torch.from_numpy(np.asarray(next(loader), np.int64))
        with torch.no_grad():
            logits = hf(batch[:, :-1]).logits
        losses.append(float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())))
    loader.close()
    return float(np.mean(losses))
