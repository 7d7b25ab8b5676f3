"""Tokenizers: ``byte``, ``char`` (built from the corpus), ``bpe`` (trained locally with Hugging
Face ``tokenizers``), any local ``tokenizer.json``, or the tokenizer a GGUF file's metadata holds
(``theseus.data.gguf_tokenizer``).

Every tokenizer round-trips: ``decode(encode(text)) == text``. Each one also exists as a
Hugging Face ``tokenizers.Tokenizer`` (``as_hf``) that encodes and decodes the same:
``export_tokenizer`` writes it as a ``tokenizer.json`` that ``transformers.AutoTokenizer`` loads.
"""

from __future__ import annotations

import abc
import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from theseus.config import ConfigError
from theseus.data import gguf_tokenizer
from theseus.data.byte_alphabet import BYTE_SYMBOLS
from theseus.data.gguf_file import is_gguf, open_gguf

EOT = "<|endoftext|>"  # the end-of-document token of byte and bpe
NAMES = ("byte", "char", "bpe")  # data.tokenizer values that are not a tokenizer.json path
CHARS_FILE, JSON_FILE = "chars.json", "tokenizer.json"
TRANSFORMERS_CONFIG = "tokenizer_config.json"  # what transformers reads beside tokenizer.json
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 but tab and newline, DEL, C1: a terminal acts on them


class Tokenizer(abc.ABC):
    """Text <-> token ids. ``eot`` ends each document in a prepared corpus (None: nothing does)."""

    kind: str  # what meta.json records: byte, char, bpe or json
    vocab_size: int
    eot: int | None

    @abc.abstractmethod
    def encode_batch(self, texts: Sequence[str], special: bool = False) -> list[np.ndarray]:
        """The ids of each text, as 1-D integer arrays; ``special``: with the tokens the tokenizer
        adds around a text (a Llama tokenizer's BOS), as ``transformers`` encodes by default."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; ValueError for an id outside the vocabulary."""

    @abc.abstractmethod
    def save(self, folder: Path) -> None:
        """Write what ``load_tokenizer(folder, self.kind)`` reads back."""

    @abc.abstractmethod
    def as_hf(self) -> tokenizers.Tokenizer:
        """This tokenizer as a Hugging Face one: the same ids for every text, the same text for every id."""

    def encode(self, text: str, special: bool = False) -> list[int]:
        return self.encode_batch([text], special)[0].tolist()

    def printable(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` as a terminal may show it: each control character but tab and newline
        (NUL, ESC, ...) as a visible ``\\xNN``, so that none acts on the terminal."""
        return escape_controls(self.decode(ids))

    def encode_documents(self, texts: Sequence[str], dtype: np.dtype) -> np.ndarray:
        """The ids of ``texts`` back to back, each text followed by ``eot`` (if any): 1-D ``dtype``."""
        return _joined(self.encode_batch(texts), self.eot, dtype)

    @property
    def prefix_token(self) -> int | None:
        """The token that stands for an empty context, as lm-eval-harness takes it: the BOS the
        tokenizer adds, else ``eot``."""
        added = self.encode("", special=True)
        return added[0] if added else self.eot


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0-255, then <|endoftext|> as 256."""

    kind = "byte"
    vocab_size = 257
    eot = 256

    def encode_batch(self, texts: Sequence[str], special: bool = False) -> list[np.ndarray]:
        return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return self._text(ids, "replace")

    def printable(self, ids: Sequence[int]) -> str:
        """As every tokenizer's, and each byte that is no UTF-8 character's (U+FFFD in ``decode``) as ``\\xNN`` too."""
        return escape_controls(self._text(ids, "backslashreplace"))

    def _text(self, ids: Sequence[int], errors: str) -> str:
        """The text of ``ids``, the bytes that are no character's handled as ``errors`` (``bytes.decode``'s)."""
        ids = _checked(ids, self.vocab_size)
        pieces = np.split(ids, np.flatnonzero(ids == self.eot))  # every piece but the first opens with eot
        return EOT.join(bytes(piece[piece != self.eot].astype(np.uint8)).decode("utf-8", errors) for piece in pieces)

    def save(self, folder: Path) -> None:
        """Nothing to save: the byte vocabulary is fixed."""

    def as_hf(self) -> tokenizers.Tokenizer:
        """GPT-2's byte-level alphabet with no merges: byte ``b`` is id ``b``; <|endoftext|> is the
        special token 256 (so, as in GPT-2's tokenizer, that literal text encodes as id 256)."""
        tokenizer = tokenizers.Tokenizer(models.BPE(vocab=dict(zip(BYTE_SYMBOLS, range(256))), merges=[]))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([EOT])
        return tokenizer


class CharTokenizer(Tokenizer):
    """One id per character of the corpus, in code point order; no special tokens, or, with
    ``eot`` (a chat corpus's, whose turns it ends), <|endoftext|> after them, as byte's 256."""

    kind = "char"

    def __init__(self, symbols: str, eot: bool = False):
        self.symbols = "".join(sorted(set(symbols)))
        self.eot = len(self.symbols) if eot else None
        self.vocab_size = len(self.symbols) + eot
        self._points = _code_points(self.symbols)

    @classmethod
    def fit(cls, texts: Iterable[str], eot: bool = False) -> CharTokenizer:
        """The vocabulary of every character in ``texts`` (and <|endoftext|>, with ``eot``)."""
        return cls("".join(set().union(*map(set, texts))), eot)

    @classmethod
    def load(cls, path: Path) -> CharTokenizer:
        """What ``save`` wrote: the vocabulary as one JSON string, or ``{"symbols": ..., "eot": "<|endoftext|>"}``."""
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} does not hold a char vocabulary ({exc}): prepare the corpus again") from exc
        symbols, eot = (saved.get("symbols"), saved.get("eot") == EOT) if isinstance(saved, dict) else (saved, False)
        if not isinstance(symbols, str) or not symbols:
            raise ConfigError(f"{path} must hold the char vocabulary as one JSON string: prepare the corpus again")
        return cls(symbols, eot)

    def encode_batch(self, texts: Sequence[str], special: bool = False) -> list[np.ndarray]:
        out = []
        for text in texts:
            points = _code_points(text)
            ids = np.minimum(np.searchsorted(self._points, points), len(self.symbols) - 1)
            unknown = np.flatnonzero(self._points[ids] != points)
            if unknown.size:
                raise ValueError(f"character {text[unknown[0]]!r} is not in the char vocabulary "
                                 "(built from the corpus)")
            out.append(ids)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        ids = _checked(ids, self.vocab_size)
        pieces = np.split(ids, np.flatnonzero(ids == self.eot)) if self.eot is not None else [ids]
        return EOT.join(self._points[piece[piece != self.eot]].astype("<u4").tobytes().decode("utf-32-le")
                        for piece in pieces)  # every piece but the first opens with eot

    def save(self, folder: Path) -> None:
        saved = self.symbols if self.eot is None else {"symbols": self.symbols, "eot": EOT}
        (folder / CHARS_FILE).write_text(json.dumps(saved), encoding="utf-8")

    def as_hf(self) -> tokenizers.Tokenizer:
        """One token per character, no merges, decoded by joining (a character outside the
        vocabulary is dropped, where ``encode`` raises); <|endoftext|> a special token, if any
        (so that literal text encodes as ``eot``, as byte's does)."""
        tokenizer = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(self.symbols)}, merges=[]))
        tokenizer.decoder = decoders.Fuse()
        if self.eot is not None:
            tokenizer.add_special_tokens([EOT])
        return tokenizer


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers.Tokenizer``: one trained here (bpe) or read from a file (json)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, kind: str, eos: str = EOT):
        """``eos``: the end-of-document token, ``<|endoftext|>`` unless a tokenizer_config.json says otherwise."""
        self.kind = kind
        self._tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eot = tokenizer.token_to_id(eos)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> HFTokenizer:
        """Byte-level BPE (GPT-2 style: every byte is in the vocabulary) trained on ``texts``."""
        tokenizer = tokenizers.Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(texts, trainer)
        return cls(tokenizer, "bpe")

    @classmethod
    def from_file(cls, path: str | Path, kind: str = "json") -> HFTokenizer:
        """Read a tokenizer.json, or a GGUF file's tokenizer; ConfigError naming the file when it
        is missing or does not parse. Its end-of-document token is the ``eos_token`` of a
        ``tokenizer_config.json`` beside it (as transformers reads a folder), or the GGUF file's
        own, else ``<|endoftext|>``. Read once per process while the files stay as they are (a
        command reads its tokenizer's size, then the tokenizer: a tenth of a second each for a
        50k vocabulary)."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise ConfigError(f"tokenizer file {path} does not exist: set data.tokenizer to "
                              f"{', '.join(NAMES)}, the path of a tokenizer.json or of a GGUF file")
        return cls._read(path, kind, (path.resolve(), _stamp(path), _stamp(path.parent / TRANSFORMERS_CONFIG)))

    @classmethod
    @functools.lru_cache(maxsize=8)
    def _read(cls, path: Path, kind: str, identity: tuple) -> HFTokenizer:
        """``from_file``'s reading, cached by the files' ``identity`` (where they are, their stamps)."""
        if is_gguf(path):
            file = open_gguf(path)
            return cls(gguf_tokenizer.build(file), kind, gguf_tokenizer.special_tokens(file).get("eos_token", EOT))
        try:
            tokenizer = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"{path} does not parse as a Hugging Face tokenizer.json ({reason}): "
                              "point data.tokenizer at a file saved by tokenizers.Tokenizer.save") from exc
        _check_unknown_token(tokenizer, path)
        return cls(tokenizer, kind, _eos_token(path.parent / TRANSFORMERS_CONFIG))

    def encode_batch(self, texts: Sequence[str], special: bool = False) -> list[np.ndarray]:
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=special)
        return [np.asarray(encoding.ids, dtype=np.int64) for encoding in encodings]

    def encode_documents(self, texts: Sequence[str], dtype: np.dtype) -> np.ndarray:
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)  # no offsets: faster
        return _joined([np.asarray(encoding.ids, dtype=dtype) for encoding in encodings], self.eot, dtype)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(_checked(ids, self.vocab_size).tolist(), skip_special_tokens=False)

    def save(self, folder: Path) -> None:
        self._tokenizer.save(str(folder / JSON_FILE))

    def as_hf(self) -> tokenizers.Tokenizer:
        return self._tokenizer


def export_tokenizer(tokenizer: Tokenizer, folder: Path, chat: Mapping[str, str] | None = None) -> None:
    """Write ``tokenizer`` into the Hugging Face folder ``folder`` as transformers reads it:
    ``tokenizer.json`` and a ``tokenizer_config.json`` naming its end-of-text token (and the BOS
    it adds, if any), so that ``AutoTokenizer.from_pretrained(folder)`` encodes as theseus does;
    ``chat``: a chat template's settings beside them (``chat_template`` and the special tokens it sees)."""
    hf = tokenizer.as_hf()
    hf.save(str(folder / JSON_FILE))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    if tokenizer.eot is not None:
        settings["eos_token"] = hf.id_to_token(tokenizer.eot)
    added = tokenizer.encode("", special=True)
    if added:
        settings["bos_token"] = hf.id_to_token(added[0])
    settings.update(chat or {})
    (folder / TRANSFORMERS_CONFIG).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def fit_tokenizer(name: str, texts: Iterable[str], bpe_vocab_size: int) -> Tokenizer:
    """The ``char`` or ``bpe`` tokenizer of a corpus (``texts`` is consumed once)."""
    return CharTokenizer.fit(texts) if name == "char" else HFTokenizer.train(texts, bpe_vocab_size)


def load_tokenizer(folder: Path, kind: str) -> Tokenizer:
    """The tokenizer a shard folder was made with, as its meta.json ``tokenizer`` records it."""
    if kind == "byte":
        return ByteTokenizer()
    path = folder / (CHARS_FILE if kind == "char" else JSON_FILE)
    if not path.is_file():
        raise ConfigError(f"{path} is missing ({folder}/meta.json says tokenizer {kind!r}): "
                          "put it back or prepare again")
    return CharTokenizer.load(path) if kind == "char" else HFTokenizer.from_file(path, kind)


def escape_controls(text: str) -> str:
    """``text`` with each control character but tab and newline as ``\\xNN``."""
    return CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def _joined(ids: list[np.ndarray], eot: int | None, dtype: np.dtype) -> np.ndarray:
    """``ids`` concatenated, each followed by ``eot`` (when not None), as ``dtype``."""
    if eot is not None:
        mark = np.array([eot], dtype=dtype)
        ids = [part for piece in ids for part in (piece, mark)]
    return np.concatenate(ids).astype(dtype, copy=False) if ids else np.zeros(0, dtype)


def _stamp(path: Path) -> tuple[int, int] | None:
    """``(size, modification time in ns)`` of a file (None: there is none), which a cache of it checks."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_size, stat.st_mtime_ns


def _eos_token(config: Path) -> str:
    """The ``eos_token`` a tokenizer_config.json names (a string, or ``{"content": ...}``), else <|endoftext|>."""
    try:
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token") if config.is_file() else None
    except (OSError, ValueError, AttributeError):
        return EOT  # a broken config is transformers' to report; the tokenizer itself stands
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else EOT


def _check_unknown_token(tokenizer: tokenizers.Tokenizer, path: Path) -> None:
    """ConfigError when ``tokenizer`` (read from ``path``) is a WordLevel or WordPiece model whose
    ``unk_token`` its vocabulary lacks: a word outside the vocabulary could not be encoded (tokenizers
    raises "Missing [UNK] token from the vocabulary" then, in the middle of preparing a corpus)."""
    model = tokenizer.model
    if isinstance(model, models.WordLevel | models.WordPiece) and tokenizer.token_to_id(model.unk_token) is None:
        kind = type(model).__name__
        raise ConfigError(f"{path}: its {kind} model's unk_token {model.unk_token!r} is not in its vocabulary, so a "
                          f"word outside the vocabulary cannot be encoded: add {model.unk_token!r} to model.vocab (or "
                          f"set model.unk_token to a token of it), or give another tokenizer")


def _checked(ids: Sequence[int], vocab_size: int) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
    return ids


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
