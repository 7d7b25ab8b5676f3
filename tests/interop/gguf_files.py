"""GGUF files of tiny random models, written as llama.cpp's convert_hf_to_gguf.py writes them.

    path = write_gguf(random_model(llama_config()), byte_level_vocabulary(), tmp / "llama.gguf", kinds=EVERY_KIND)

The metadata under llama.cpp's keys (``llama.block_count``, ...: each family's as its converter
class writes them; ``tokenizer.ggml.*``: the vocabulary in id order padded to the model's rows
with ``[PADn]``, each token's type, the merges, the special ids, the chat template), the tensors
under GGUF names (the gguf package's own map), as the converter changes them: q and k of a Llama
(and of a Mistral, which it writes as a Llama) permuted, Gemma's RMSNorm gains plus 1, Llama 3.1's
RoPE scaling as ``rope_freqs.weight``. 2-D weights are quantised with ``gguf.quants.quantize``, 1-D
ones float32. The gguf package cannot quantise Q4_K and Q6_K: those tensors are blocks of random
bytes with small, finite scales, which both readers dequantise alike.

Test dependencies: torch (CPU) and transformers (the models), gguf.
"""

from __future__ import annotations

import dataclasses
import json
import math
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


def qwen3_config(**changes) -> transformers.Qwen3Config:
    """Qwen3: q/k norms over heads 128 wide (transformers' GGUF loader assumes that width; the file
    states it), twice d_model / heads."""
    return transformers.Qwen3Config(**{
        "vocab_size": 320, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "max_position_embeddings": 128,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "bos_token_id": 1,
        "eos_token_id": 2, "pad_token_id": None, **changes})


def mistral_config(**changes) -> transformers.MistralConfig:
    """Mistral without a window (v0.2 on; llama.cpp attends to the whole context of any), a
    SentencePiece vocabulary of 576 rows."""
    return transformers.MistralConfig(**{
        "vocab_size": 576, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128, "sliding_window": None,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2, "pad_token_id": None, **changes})


def phi3_config(**changes) -> transformers.Phi3Config:
    """Phi-3: q, k, v and gate, up stored fused; no window (llama.cpp computes Phi-3 without one);
    Phi-3's SentencePiece vocabulary in 576 rows (its special ids the file's)."""
    return transformers.Phi3Config(**{
        "vocab_size": 576, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
        "original_max_position_embeddings": 128, "sliding_window": None, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **changes})


def gemma2_config(**changes) -> transformers.Gemma2Config:
    """Gemma 2: a sliding layer (window 8) then a global one, heads 256 wide and the soft-caps of
    every Gemma 2 (what transformers' GGUF loader assumes, the file stating them); Gemma's
    vocabulary in 576 rows."""
    return transformers.Gemma2Config(**{
        "vocab_size": 576, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256, "query_pre_attn_scalar": 256,
        "max_position_embeddings": 128, "sliding_window": 8, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6, "bos_token_id": 2, "eos_token_id": 1,
        "pad_token_id": 0, **changes})


def gemma3_config(**changes) -> transformers.Gemma3TextConfig:
    """Gemma 3 (text): q/k norms, two sliding layers (window 8) with their own RoPE base, heads 256
    wide; Gemma's vocabulary in 576 rows."""
    return transformers.Gemma3TextConfig(**{
        "vocab_size": 576, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256, "query_pre_attn_scalar": 256,
        "max_position_embeddings": 128, "sliding_window": 8, "rms_norm_eps": 1e-6,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, **changes})


# each family as transformers' GGUF loader reads its file in full: the config's every value in the file
FAMILIES = {"llama": llama_config, "qwen2": qwen2_config, "qwen3": qwen3_config, "mistral": mistral_config,
            "phi3": phi3_config, "gemma2": gemma2_config, "gemma3": gemma3_config}


def llama31_config() -> transformers.LlamaConfig:
    """Llama 3.1's RoPE scaling (factor 8 from an original context of 8192) over heads 64 wide,
    whose 32 frequencies fall in every band: kept, interpolated (3), divided by the factor."""
    return llama_config(hidden_size=256, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, max_position_embeddings=131072)


# families whose files hold what transformers' GGUF loader does not read (llama.cpp does): their
# models at small sizes, the values it ignores set apart from what it assumes
ORIGINALS = {
    "llama3.1": llama31_config,
    "gemma2": lambda: gemma2_config(hidden_size=64, head_dim=32, query_pre_attn_scalar=32, attn_logit_softcapping=2.0,
                                    final_logit_softcapping=5.0),
    "gemma3": lambda: gemma3_config(
        hidden_size=64, head_dim=32, query_pre_attn_scalar=32, num_hidden_layers=6, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}),
}
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                      "gemma2": "gemma2", "gemma3_text": "gemma3"}  # model_type -> what the converter writes


def family_vocabulary(model) -> Vocabulary:
    """The kind of vocabulary files of ``model``'s family hold: Gemma's and Phi-3's SentencePiece,
    Llama 2's for a Mistral, byte-level BPE for the others."""
    return {"gemma2": gemma_vocabulary, "gemma3_text": gemma_vocabulary, "phi3": phi3_vocabulary,
            "mistral": sentencepiece_vocabulary}.get(model.config.model_type, byte_level_vocabulary)()


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
    pieces, trained = _pieces("first")
    tokens = ["<unk>", "<s>", "</s>", *BYTES, *pieces]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
             *(gguf.TokenType.BYTE for _ in BYTES), *(gguf.TokenType.NORMAL for _ in pieces)]
    scores = [0.0] * (3 + len(BYTES)) + [-float(i) for i in range(len(pieces))]
    return Vocabulary("llama", tokens, types, trained if merges else None, scores, add_bos=add_bos,
                      ids={"bos": 1, "eos": 2, "unk": 0})


def gemma_vocabulary() -> Vocabulary:
    """A SentencePiece vocabulary laid out as Gemma's files hold one: ``<pad>``, ``<eos>``,
    ``<bos>``, ``<unk>``, ``<mask>`` (user-defined: transformers makes it special anyway), the turn
    markers (control), runs of spaces spelled with spaces (user-defined, as the converter writes
    Gemma's added tokens), the byte tokens, then pieces trained without a space prepended (one of
    them ``\u2581\u2581``, which the runs respell); no merges, scores that do not follow the ids."""
    pieces, _ = _pieces("never")
    control, user = ["<pad>", "<eos>", "<bos>"], ["<mask>"]
    turns, spaces = ["<start_of_turn>", "<end_of_turn>"], ["  ", "   ", "    "]
    tokens = [*control, "<unk>", *user, *turns, *spaces, *BYTES, *pieces]
    types = [*(gguf.TokenType.CONTROL for _ in control), gguf.TokenType.UNKNOWN,
             *(gguf.TokenType.USER_DEFINED for _ in user), *(gguf.TokenType.CONTROL for _ in turns),
             *(gguf.TokenType.USER_DEFINED for _ in spaces), *(gguf.TokenType.BYTE for _ in BYTES),
             *(gguf.TokenType.NORMAL for _ in pieces)]
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float((7 * i) % len(pieces)) for i in range(len(pieces))]
    return Vocabulary("llama", tokens, types, None, scores, add_bos=True, ids={"bos": 2, "eos": 1, "unk": 3, "pad": 0})


def phi3_vocabulary() -> Vocabulary:
    """A SentencePiece vocabulary laid out as Phi-3's files hold one: Llama's (``<unk>``, ``<s>``,
    ``</s>``, bytes, scored pieces) then its chat tokens (control, one user-defined), scored -1000
    as the converter scores added tokens; no merges, no BOS added."""
    llama = sentencepiece_vocabulary()
    control, user = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>"], ["<|placeholder1|>"]
    tokens = [*llama.tokens, *control, *user]
    types = [*llama.types, *(gguf.TokenType.CONTROL for _ in control), gguf.TokenType.USER_DEFINED]
    eos = tokens.index("<|endoftext|>")
    return Vocabulary("llama", tokens, types, None, [*llama.scores, *(-1000.0 for _ in (*control, *user))],
                      add_bos=False, ids={"bos": 1, "eos": eos, "unk": 0, "pad": eos})


BYTES = [f"<0x{b:02X}>" for b in range(256)]


def _pieces(prepend: str) -> tuple[list[str], list[str]]:
    """300 SentencePiece-style pieces (``\u2581`` for a space; ``prepend``: Metaspace's scheme)
    trained on local text, in id order, and their merges (``"a b"`` each)."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend, split=True)
    tokenizer.train_from_iterator([CORPUS.read_text()], trainers.BpeTrainer(vocab_size=300, show_progress=False))
    saved = json.loads(tokenizer.to_str())
    return (sorted(saved["model"]["vocab"], key=saved["model"]["vocab"].get),
            [m if isinstance(m, str) else " ".join(m) for m in saved["model"]["merges"]])


def write_gguf(model, vocabulary: Vocabulary, path: Path, kinds: Sequence[Q] = (Q.F32,), name: str = "tiny",
               arch: str = "llama") -> Path:
    """``model`` (a transformers model of a family in GGUF_ARCHITECTURES; None: a tokenizer alone,
    of an ``arch`` model) and ``vocabulary`` (padded to the model's rows) as the GGUF file ``path``,
    its 2-D weights in ``kinds``, one after another in the file's order; ``name``: general.name."""
    config = model.config if model is not None else None
    arch = GGUF_ARCHITECTURES[config.model_type] if config else arch
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    if config is not None:
        _write_config(writer, config.to_dict(), arch)
        vocabulary = vocabulary.padded(config.vocab_size)
    vocabulary.write(writer)
    if model is not None:
        _write_tensors(writer, model, arch, kinds)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_config(writer: gguf.GGUFWriter, hp: dict, arch: str) -> None:
    """The metadata of config.json ``hp`` as the converter's class for ``arch`` writes it
    (TextModel's for most; Phi3MiniModel and Gemma2Model their own)."""
    rope = hp.get("rope_parameters") or {}
    full = rope.get("full_attention", rope)
    writer.add_block_count(hp["num_hidden_layers"])
    writer.add_context_length(hp["max_position_embeddings"])
    writer.add_embedding_length(hp["hidden_size"])
    writer.add_feed_forward_length(hp["intermediate_size"])
    writer.add_head_count(hp["num_attention_heads"])
    writer.add_head_count_kv(hp["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    if arch != "gemma2":  # Gemma2Model writes no base: llama.cpp's 10000
        writer.add_rope_freq_base(full["rope_theta"])
    if full.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    if "sliding_attention" in rope:
        writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    if hp.get("head_dim") is not None and arch != "phi3":
        writer.add_key_length(hp["head_dim"])
        writer.add_value_length(hp["head_dim"])
    if arch == "llama":
        writer.add_vocab_size(hp["vocab_size"])
        writer.add_rope_dimension_count(hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"])
    if arch == "phi3":
        writer.add_rope_dimension_count(hp["hidden_size"] // hp["num_attention_heads"])
        writer.add_rope_scaling_orig_ctx_len(hp["original_max_position_embeddings"])
        writer.add_sliding_window(hp["sliding_window"] or 0)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(hp["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(hp["final_logit_softcapping"])
    if arch in ("gemma2", "gemma3"):
        writer.add_sliding_window(hp["sliding_window"])
    if arch == "gemma3" and hp.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(hp["final_logit_softcapping"])


def _write_tensors(writer: gguf.GGUFWriter, model, arch: str, kinds: Sequence[Q]) -> None:
    """Every tensor of ``model`` under its GGUF name (a tied head left out), as the converter
    changes it (a Llama's q and k permuted, Gemma's norm gains plus 1, Llama 3.1's RoPE divisors
    added), the n-th 2-D one stored as ``kinds[n % len(kinds)]``, 1-D ones float32."""
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
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            value = value + 1
        kind = kinds[matrices % len(kinds)] if value.ndim == 2 else Q.F32
        matrices += value.ndim == 2
        writer.add_tensor(name, quantized(value, kind), raw_dtype=kind if kind not in (Q.F32, Q.F16) else None)
    rope = config.to_dict().get("rope_parameters") or {}
    if rope.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_divisors(config.to_dict(), rope))


def llama3_divisors(hp: dict, rope: dict) -> np.ndarray:
    """``rope_freqs.weight`` as LlamaModel.generate_extra_tensors computes it (in torch's float32):
    each frequency's divisor under Llama 3.1's RoPE scaling, its original context the config's
    top-level ``original_max_position_embeddings`` or 8192."""
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context_len = hp.get("original_max_position_embeddings", 8192)
    divisors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_context_len / high:
            divisors.append(1)
        elif wavelen > old_context_len / low:
            divisors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(divisors, dtype=torch.float32).numpy()


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
