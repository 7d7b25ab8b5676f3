"""The tokenizer a GGUF file describes, built from its ``tokenizer.ggml.*`` metadata.

    tokenizer = build(open_gguf(path))      # a tokenizers.Tokenizer
    special_tokens(open_gguf(path))         # {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", ...}

A GGUF file holds no tokenizer.json: llama.cpp's converter stores the vocabulary (``tokens``, in id
order), the ``merges``, each token's type (normal, control, user-defined, byte), the special
tokens' ids and whether a BOS is added. This rebuilds the tokenizer transformers' GGUF loader
(``AutoTokenizer.from_pretrained(folder, gguf_file=...)``) builds from them, so that both give the
same ids for every text:

- ``tokenizer.ggml.model == "gpt2"``: byte-level BPE (GPT-2, SmolLM, Llama 3, Qwen), its text split
  before the merges by the pattern ``tokenizer.ggml.pre`` names (GPT-2's for one not listed);
- ``"llama"``: SentencePiece's BPE (Llama 2, Mistral): ``\u2581`` for a space, one prepended to the
  text, bytes as ``<0xNN>`` tokens for characters outside the vocabulary, the merges the file
  gives or, when it has none, those its scores imply.

Control tokens (and the named bos, eos, unk and pad tokens) are special: matched whole in the text
and kept by ``decode``; user-defined ones are matched whole too. Any other tokenizer model is
refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from theseus.config import ConfigError
from theseus.data.byte_alphabet import BYTE_SYMBOLS
from theseus.data.gguf_file import GGUFFile

PREFIX = "tokenizer.ggml."
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types (gguf.TokenType)
NAMED = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
         "pad_token": "padding_token_id"}  # transformers' name -> the GGUF key of its id
SPACE = "\u2581"  # SentencePiece's word boundary

# llama.cpp's pre-tokenizer names -> the pattern splitting text before the merges (the ones the
# original tokenizer.json of those models uses); any other name gets GPT-2's, as transformers' loader does
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3, "smaug-bpe": _LLAMA3,
          "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2}
# architectures whose SentencePiece vocabulary transformers rebuilds otherwise (spaces spelled out, a
# normalizer instead of a pre-tokenizer): refused rather than tokenized differently
OWN_SENTENCEPIECE = ("gemma", "gemma2", "gemma3", "phi3")


def build(file: GGUFFile) -> tokenizers.Tokenizer:
    """The tokenizer ``file``'s metadata describes (see the module); ConfigError when it has
    none or its model is not byte-level or SentencePiece BPE."""
    meta = file.metadata
    kind = meta.get(PREFIX + "model")
    tokens = meta.get(PREFIX + "tokens")
    if kind is None or not tokens:
        raise ConfigError(f"{file.path} holds no tokenizer ({PREFIX}model and {PREFIX}tokens): set data.tokenizer "
                          f"to a tokenizer.json of this model")
    architecture = meta.get("general.architecture")
    if kind == "gpt2":
        tokenizer = _byte_level(tokens, _merges(meta), meta.get(PREFIX + "pre"))
    elif kind == "llama" and architecture not in OWN_SENTENCEPIECE:
        tokenizer = _sentencepiece(tokens, _merges(meta) or _implied_merges(tokens, meta.get(PREFIX + "scores")))
    else:
        raise ConfigError(f"{file.path}: a {kind!r} tokenizer of a {architecture} model is not supported (theseus "
                          f"builds byte-level BPE, 'gpt2', and SentencePiece BPE, 'llama'): set data.tokenizer to a "
                          f"tokenizer.json of this model")
    _add_special(tokenizer, tokens, meta, byte_level=kind == "gpt2")
    tokenizer.post_processor = _post_processor(meta, tokens, add_bos_default=kind == "llama")
    return tokenizer


def special_tokens(file: GGUFFile) -> dict[str, str]:
    """The named special tokens the file sets (``bos_token``, ``eos_token``, ``unk_token``,
    ``pad_token``), as a tokenizer_config.json names them."""
    tokens = file.metadata.get(PREFIX + "tokens") or []
    found = {}
    for name, key in NAMED.items():
        index = file.metadata.get(PREFIX + key)
        if index is not None and 0 <= index < len(tokens):
            found[name] = tokens[index]
    return found


def chat_template(file: GGUFFile) -> str | None:
    """The Jinja chat template the file holds (``tokenizer.chat_template``), if any."""
    source = file.metadata.get("tokenizer.chat_template")
    return source if isinstance(source, str) else None


def _merges(meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The file's merges, ``"a b"`` each, as pairs."""
    return [tuple(merge.split(" ", 1)) for merge in meta.get(PREFIX + "merges") or []]


def _byte_level(tokens: Sequence[str], merges: list[tuple[str, str]], pre: str | None) -> tokenizers.Tokenizer:
    """GPT-2's byte-level BPE over ``tokens`` (a token spelled in raw text rather than in the
    byte alphabet, as some converters store added tokens, respelled byte by byte)."""
    alphabet = set(BYTE_SYMBOLS)
    vocab = {token if set(token) <= alphabet else "".join(BYTE_SYMBOLS[b] for b in token.encode()): index
             for index, token in enumerate(tokens)}
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                                                end_of_word_suffix="", fuse_unk=False))
    split = SPLITS.get(pre)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False) if split is None else \
        pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece(tokens: Sequence[str], merges: list[tuple[str, str]]) -> tokenizers.Tokenizer:
    """SentencePiece's BPE (as Llama's tokenizer.json): ``\u2581`` for spaces, one prepended to the
    text, byte fallback, unknown pieces fused."""
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                                                dropout=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(content=" ", left=1)])
    return tokenizer


def _implied_merges(tokens: Sequence[str], scores: Sequence[float] | None) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies when the file lists none: every way to cut
    a token into two tokens of the vocabulary, the better the token's score the earlier (ties:
    the shorter left piece, then the shorter right piece first), each token's cuts in the order of
    their pieces' ids."""
    if scores is None:
        return []
    ids = {token: index for index, token in enumerate(tokens)}
    ranked = []
    for token, score in dict(zip(tokens, scores, strict=True)).items():
        cuts = sorted(((token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in ids and token[k:] in ids),
                      key=lambda pair: (ids[pair[0]], ids[pair[1]]))
        ranked += [(-score, len(left), len(right), left, right) for left, right in cuts]
    ranked.sort(key=lambda entry: entry[:3])  # stable: equal keys keep the order above
    return [(left, right) for *_, left, right in ranked]


def _add_special(tokenizer: tokenizers.Tokenizer, tokens: Sequence[str], meta: Mapping[str, Any],
                 byte_level: bool) -> None:
    """Control tokens and the named ones as special tokens, user-defined ones as added tokens:
    matched whole in a text. (In a byte-level vocabulary a control token spelled outside the byte
    alphabet is a converter's mislabel, left alone.)"""
    types = meta.get(PREFIX + "token_type") or [0] * len(tokens)
    alphabet = set(BYTE_SYMBOLS)
    named = {meta.get(PREFIX + key) for key in NAMED.values()}
    special = [token for index, (token, kind) in enumerate(zip(tokens, types, strict=True))
               if (kind == CONTROL and not (byte_level and not set(token) <= alphabet)) or index in named]
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in special])
    vocab = tokenizer.get_vocab()
    tokenizer.add_tokens([AddedToken(token, normalized=False, special=False) for token, kind in
                          zip(tokens, types, strict=True) if kind == USER_DEFINED and token in vocab])


def _post_processor(meta: Mapping[str, Any], tokens: Sequence[str], add_bos_default: bool) -> processors.PostProcessor:
    """The tokens added around an encoded text: the BOS when ``tokenizer.ggml.add_bos_token``
    (absent: SentencePiece files add it, byte-level ones do not), the EOS when ``add_eos_token``."""
    around = []
    for key, default, placement in (("bos", add_bos_default, "start"), ("eos", False, "end")):
        index = meta.get(f"{PREFIX}{key}_token_id")
        if meta.get(f"{PREFIX}add_{key}_token", default) and index is not None:
            around.append((placement, tokens[index], index))
    start = [f"{token}:0" for placement, token, _ in around if placement == "start"]
    end = [f"{token}:0" for placement, token, _ in around if placement == "end"]
    return processors.TemplateProcessing(single=" ".join([*start, "$A:0", *end]),
                                         special_tokens=[(token, index) for _, token, index in around])

