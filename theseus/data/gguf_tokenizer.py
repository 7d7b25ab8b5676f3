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
  gives or, when it has none, those its scores imply. Two architectures' vocabularies transformers
  builds otherwise, from what their own tokenizer.json holds (``SENTENCEPIECE``): Gemma's (no space
  prepended, every space spelled ``\u2581`` by a normalizer, tokens of spaces alone respelled so,
  merges in the order of the tokens' ids) and Phi-3's (a ``\u2581`` prepended to
  every stretch of text between special tokens, by a normalizer).

Control tokens, the named bos, eos, unk and pad tokens and those transformers' tokenizer classes add
of their own (``LLAMA_OWN``, ``GEMMA_OWN``, ``GEMMA_MASK``; new ones past the vocabulary) are
special: matched whole in the text and kept by ``decode``; user-defined ones are matched whole too.
Any other tokenizer model is refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

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
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {**dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                           "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3),
          **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2), "qwen35": _QWEN35,
          "tekken": _TEKKEN,  # Mistral Nemo's and Small's
          **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O)}  # transformers' table
# the special tokens transformers' tokenizer classes add of their own whatever the file says: its
# SentencePiece builders' (LlamaTokenizer's, GemmaTokenizer's), first; GemmaTokenizer's mask, last
LLAMA_OWN, GEMMA_OWN, GEMMA_MASK = ("<s>", "</s>", "<unk>"), ("<bos>", "<eos>", "<unk>", "<pad>", "<mask>"), "<mask>"


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
    elif kind == "llama":
        tokenizer = SENTENCEPIECE.get(architecture, _llama)(tokens, meta)
    else:
        raise ConfigError(f"{file.path}: a {kind!r} tokenizer of a {architecture} model is not supported (theseus "
                          f"builds byte-level BPE, 'gpt2', and SentencePiece BPE, 'llama'): set data.tokenizer to a "
                          f"tokenizer.json of this model")
    _add_special(tokenizer, tokens, meta, byte_level=kind == "gpt2",
                 named=(GEMMA_MASK,) if architecture in GEMMA else ())
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


def _merges(meta: Mapping[str, Any], tokens: Sequence[str] = (), scores: Sequence[float] | None = None
            ) -> list[tuple[str, str]]:
    """The file's merges (``"a b"`` each) as pairs; when it lists none, those the vocabulary
    ``tokens`` ranked by ``scores`` implies (``_implied_merges``)."""
    merges = meta.get(PREFIX + "merges")
    return _implied_merges(tokens, scores) if merges is None else [tuple(merge.split(" ", 1)) for merge in merges]


def _byte_level(tokens: Sequence[str], merges: list[tuple[str, str]], pre: str | None) -> tokenizers.Tokenizer:
    """GPT-2's byte-level BPE over ``tokens`` (a token spelled in raw text rather than in the
    byte alphabet, as some converters store added tokens, respelled byte by byte)."""
    alphabet = set(BYTE_SYMBOLS)
    vocab = {token if set(token) <= alphabet else "".join(BYTE_SYMBOLS[b] for b in token.encode()): index
             for index, token in enumerate(tokens)}
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None,
                                                continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    split = SPLITS.get(pre)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False) if split is None else \
        pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _llama(tokens: Sequence[str], meta: Mapping[str, Any]) -> tokenizers.Tokenizer:
    """SentencePiece's BPE (as Llama's tokenizer.json): ``\u2581`` for spaces, one prepended to the
    text, byte fallback, unknown pieces fused; the file's merges, else those its scores imply."""
    tokenizer = _sentencepiece(tokens, _merges(meta, tokens, meta.get(PREFIX + "scores")), LLAMA_OWN)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(content=" ", left=1)])
    return tokenizer


def _phi3(tokens: Sequence[str], meta: Mapping[str, Any]) -> tokenizers.Tokenizer:
    """Phi-3's: Llama's, its ``\u2581`` prepended and its spaces spelled by a normalizer rather
    than the pre-tokenizer, so that each stretch of text between special tokens gets one."""
    tokenizer = _llama(tokens, meta)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    tokenizer.pre_tokenizer = None
    return tokenizer


def _gemma(tokens: Sequence[str], meta: Mapping[str, Any]) -> tokenizers.Tokenizer:
    """Gemma's: no space prepended, spaces spelled ``\u2581`` by a normalizer, a token of spaces
    alone (which the file spells with spaces) respelled with ``\u2581``; without merges in the file,
    those the vocabulary implies ranked by the tokens' ids (Gemma's scores do not follow its merges)."""
    respelled = [SPACE * len(token) if " " in token and not token.strip() else token for token in tokens]
    tokenizer = _sentencepiece(respelled, _merges(meta, respelled, [-float(i) for i in range(len(respelled))]),
                               GEMMA_OWN, unk="<unk>")
    tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tokenizer


GEMMA = ("gemma", "gemma2", "gemma3")
SENTENCEPIECE = {**dict.fromkeys(GEMMA, _gemma), "phi3": _phi3}  # by general.architecture


def _sentencepiece(tokens: Sequence[str], merges: list[tuple[str, str]], own: Sequence[str],
                   unk: str | None = None) -> tokenizers.Tokenizer:
    """SentencePiece's BPE model over ``tokens``: byte fallback, unknown pieces fused (``unk``:
    the unknown token's spelling, for a model that names one), ``own`` special tokens (new ones
    past the vocabulary)."""
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                                                dropout=None, **({"unk_token": unk} if unk else {})))
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in own])
    return tokenizer


def _implied_merges(tokens: Sequence[str], scores: Sequence[float] | None) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies when the file lists none: every way to cut
    a token into two tokens of the vocabulary, the better the token's score the earlier (ties:
    the longer left piece, then the longer right piece first), each token's cuts in the order of
    their pieces' ids: transformers' ``generate_merges``."""
    if scores is None:
        return []
    ids = {token: index for index, token in enumerate(tokens)}
    ranked = []
    for token, score in dict(zip(tokens, scores, strict=True)).items():
        cuts = sorted(((token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in ids and token[k:] in ids),
                      key=lambda pair: (ids[pair[0]], ids[pair[1]]))
        ranked += [(-score, -len(left), -len(right), left, right) for left, right in cuts]
    ranked.sort(key=lambda entry: entry[:3])  # stable: equal keys keep the order above
    return [(left, right) for *_, left, right in ranked]


def _add_special(tokenizer: tokenizers.Tokenizer, tokens: Sequence[str], meta: Mapping[str, Any],
                 byte_level: bool, named: Sequence[str] = ()) -> None:
    """Control tokens as special tokens, then user-defined ones as added tokens, then the named
    ones (the file's bos, eos, unk and pad, and ``named``) not added yet as special tokens: all
    matched whole in a text, as transformers adds them. (In a byte-level vocabulary a control token
    spelled outside the byte alphabet is a converter's mislabel, left alone.)"""
    types = meta.get(PREFIX + "token_type") or [0] * len(tokens)
    alphabet = set(BYTE_SYMBOLS)
    control = [token for token, kind in zip(tokens, types, strict=True)
               if kind == CONTROL and not (byte_level and not set(token) <= alphabet)]
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in control])
    vocab = tokenizer.get_vocab()
    user = [token for token, kind in zip(tokens, types, strict=True) if kind == USER_DEFINED and token in vocab]
    tokenizer.add_tokens([AddedToken(token, normalized=False, special=False) for token in user])
    ids = [meta.get(PREFIX + key) for key in NAMED.values()]
    rest = [token for token in [*(tokens[i] for i in ids if i is not None), *named] if token not in {*control, *user}]
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in dict.fromkeys(rest)])


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

