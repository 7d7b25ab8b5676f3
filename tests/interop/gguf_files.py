"""GGUF files of tiny random models, written as llama.cpp's convert_hf_to_gguf.py writes them.

    path = write_gguf(random_model(llama_config()), byte_level_vocabulary(), tmp / "llama.gguf", kinds=EVERY_KIND)

The metadata under llama.cpp's keys (``llama.block_count``, ...; ``tokenizer.ggml.*``: the
vocabulary in id order padded to the model's rows with ``[PADn]``, each token's type, the merges,
the special ids, the chat template), the tensors under GGUF names (the gguf package's own map),
q and k of a Llama permuted as the converter permutes them, 2-D weights quantised with
``gguf.quants.quantize``, 1-D ones float32. The gguf package cannot quantise Q4_K and Q6_K: those
tensors are blocks of random bytes with small, finite scales, which both readers dequantise alike.

Test dependencies: torch (CPU) and transformers (the models), gguf.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np
import tokenizers
from gguf import GGMLQuantizationType as Q
from tokenizers import models, pre_tokenizers, trainers

from interop.hf_models import CORPUS, torch, transformers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2, as SmolLM2's
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
EVERY_KIND = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K)
RANDOM_BLOCKS = {Q.Q4_K: ((0, 2e-4), (2, 2e-3)), Q.Q6_K: ((208, 5e-5),)}  # byte offset of each f16 scale, its value


def llama_config(**changes) -> transformers.LlamaConfig:
    """A Llama whose rows are whole K-quant blocks (256): 4 query heads of 64, 2 kv heads, untied
    embeddings, 320 rows of vocabulary (the tokenizer's 301 tokens padded)."""
    return transformers.LlamaConfig(**{
        "vocab_size": 320, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": None, **changes})


def qwen2_config(**changes) -> transformers.Qwen2Config:
    """Qwen2's layout at llama_config's sizes: q, k and v biases, tied embeddings."""
    return transformers.Qwen2Config(**{
        "vocab_size": 320, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "use_sliding_window": False, "bos_token_id": 1,
        "eos_token_id": 2, "pad_token_id": None, **changes})


def random_model(config) -> torch.nn.Module:
    """The model of ``config`` with every weight drawn from N(0, 0.2), biases too, and norm scales
    from N(1, 0.2)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    return model.eval()


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """A tokenizer as a GGUF file's ``tokenizer.ggml.*`` metadata holds it (ids in order)."""

    model: str  # tokenizer.ggml.model: gpt2 (byte-level BPE) or llama (SentencePiece BPE)
    tokens: list[str]
    types: list[int]
    merges: list[str] | None  # "a b" each; None: none written (a SentencePiece file's, usually)
    scores: list[float] | None
    pre: str | None = None
    add_bos: bool | None = None  # tokenizer.ggml.add_bos_token; None: not written
    ids: dict[str, int] = dataclasses.field(default_factory=lambda: {"bos": 1, "eos": 2, "unk": 0, "pad": 2})

    def padded(self, rows: int) -> Vocabulary:
        """Padded to ``rows`` tokens as convert_hf_to_gguf.py pads (``[PADn]``, unused)."""
        extra = range(len(self.tokens), rows)
        return dataclasses.replace(self, tokens=[*self.tokens, *(f"[PAD{i}]" for i in extra)],
                                   types=[*self.types, *(gguf.TokenType.UNUSED for _ in extra)],
                                   scores=None if self.scores is None else [*self.scores, *(-1000.0 for _ in extra)])

    def write(self, writer: gguf.GGUFWriter) -> None:
        writer.add_tokenizer_model(self.model)
        if self.pre is not None:
            writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.types)
        if self.scores is not None:
            writer.add_token_scores(self.scores)
        if self.merges is not None:
            writer.add_token_merges(self.merges)
        for name, index in self.ids.items():
            getattr(writer, f"add_{name}_token_id")(index)
        if self.add_bos is not None:
            writer.add_add_bos_token(self.add_bos)
        writer.add_chat_template(CHATML)


def byte_level_vocabulary(pre: str = "smollm", add_bos: bool | None = False) -> Vocabulary:
    """A byte-level BPE of 300 tokens (SPECIALS first, ``<think>`` an added token past them)
    trained on local text, as convert_hf_to_gguf.py's get_vocab_base writes one: special added
    tokens as control tokens, other added ones as user-defined."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator([CORPUS.read_text()], trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    saved = json.loads(tokenizer.to_str())
    tokens = sorted(saved["model"]["vocab"], key=saved["model"]["vocab"].get) + ["<think>"]
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.USER_DEFINED if t == "<think>"
             else gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in saved["model"]["merges"]]
    return Vocabulary("gpt2", tokens, types, merges, None, pre=pre, add_bos=add_bos)


def sentencepiece_vocabulary(merges: bool = False, add_bos: bool | None = None) -> Vocabulary:
    """A SentencePiece BPE as Llama 2's files hold one: ``<unk>``, ``<s>``, ``</s>``, the 256
    byte tokens ``<0xNN>``, then 300 pieces (``\u2581`` for a space) trained on local text, each
    scored minus its rank; the merges written only with ``merges``."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    tokenizer.train_from_iterator([CORPUS.read_text()], trainers.BpeTrainer(vocab_size=300, show_progress=False))
    saved = json.loads(tokenizer.to_str())
    pieces = sorted(saved["model"]["vocab"], key=saved["model"]["vocab"].get)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
             *(gguf.TokenType.BYTE for _ in range(256)), *(gguf.TokenType.NORMAL for _ in pieces)]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    written = [m if isinstance(m, str) else " ".join(m) for m in saved["model"]["merges"]] if merges else None
    return Vocabulary("llama", tokens, types, written, scores, add_bos=add_bos,
                      ids={"bos": 1, "eos": 2, "unk": 0})


def write_gguf(model, vocabulary: Vocabulary, path: Path, kinds: Sequence[Q] = (Q.F32,), name: str = "tiny") -> Path:
    """``model`` (a transformers Llama or Qwen2; None: a tokenizer alone, of a Llama) and
    ``vocabulary`` (padded to the model's rows) as the GGUF file ``path``, its 2-D weights in
    ``kinds``, one after another in the file's order."""
    config = model.config if model is not None else None
    arch = {"llama": "llama", "qwen2": "qwen2"}[config.model_type] if config else "llama"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    if config is not None:
        _write_config(writer, config, arch)
        vocabulary = vocabulary.padded(config.vocab_size)
    vocabulary.write(writer)
    if model is not None:
        _write_tensors(writer, model, arch, kinds)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_config(writer: gguf.GGUFWriter, config, arch: str) -> None:
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if arch == "llama":
        writer.add_vocab_size(config.vocab_size)
        writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)


def _write_tensors(writer: gguf.GGUFWriter, model, arch: str, kinds: Sequence[Q]) -> None:
    """Every tensor of ``model`` under its GGUF name (a tied head left out), q and k of a Llama
    permuted, the n-th 2-D one stored as ``kinds[n % len(kinds)]``, 1-D ones float32."""
    config = model.config
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch),
                                     config.num_hidden_layers)
    matrices = 0
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        module, _, suffix = hf_name.rpartition(".")
        name = f"{names.get_name(module)}.{suffix}"
        value = tensor.float().numpy()
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            value = permute(value, config.num_attention_heads if "attn_q" in name else config.num_key_value_heads)
        kind = kinds[matrices % len(kinds)] if value.ndim == 2 else Q.F32
        matrices += value.ndim == 2
        writer.add_tensor(name, quantized(value, kind), raw_dtype=kind if kind not in (Q.F32, Q.F16) else None)


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py permutation of q and k rows (LlamaModel.permute)."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def quantized(value: np.ndarray, kind: Q) -> np.ndarray:
    """``value`` stored as ``kind``: the gguf package's quantisation, or for Q4_K and Q6_K (which it
    cannot quantise) random blocks of ``value``'s shape with small finite scales."""
    if kind not in RANDOM_BLOCKS:
        return gguf.quants.quantize(value, kind)
    block, size = gguf.GGML_QUANT_SIZES[kind]
    blocks = np.random.default_rng(value.size).integers(0, 256, (value.size // block, size), dtype=np.uint8)
    for offset, scale in RANDOM_BLOCKS[kind]:
        blocks[:, offset:offset + 2] = np.full((len(blocks), 1), scale, np.float16).view(np.uint8)
    return blocks.reshape(*value.shape[:-1], value.shape[-1] // block * size)


def transformers_tokenizer(path: Path):
    """transformers' own GGUF loader's tokenizer of ``path``."""
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
