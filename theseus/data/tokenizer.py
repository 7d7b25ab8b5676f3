"""Tokenizers: ``byte``, ``char`` (built from the corpus), ``bpe`` (trained locally with Hugging
Face ``tokenizers``), or any local ``tokenizer.json``.

Every tokenizer round-trips: ``decode(encode(text)) == text``.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from theseus.config import ConfigError

EOT = "<|endoftext|>"  # the end-of-document token of byte and bpe
NAMES = ("byte", "char", "bpe")  # data.tokenizer values that are not a tokenizer.json path
CHARS_FILE, JSON_FILE = "chars.json", "tokenizer.json"


class Tokenizer(abc.ABC):
    """Text <-> token ids. ``eot`` ends each document in a prepared corpus (None: nothing does)."""

    kind: str  # what meta.json records: byte, char, bpe or json
    vocab_size: int
    eot: int | None

    @abc.abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The ids of each text, as 1-D integer arrays."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; ValueError for an id outside the vocabulary."""

    @abc.abstractmethod
    def save(self, folder: Path) -> None:
        """Write what ``load_tokenizer(folder, self.kind)`` reads back."""

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0].tolist()


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0-255, then <|endoftext|> as 256."""

    kind = "byte"
    vocab_size = 257
    eot = 256

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        ids = _checked(ids, self.vocab_size)
        pieces = np.split(ids, np.flatnonzero(ids == self.eot))  # every piece but the first opens with eot
        return EOT.join(bytes(piece[piece != self.eot].astype(np.uint8)).decode("utf-8", "replace") for piece in pieces)

    def save(self, folder: Path) -> None:
        """Nothing to save: the byte vocabulary is fixed."""


class CharTokenizer(Tokenizer):
    """One id per character of the corpus, in code point order; no special tokens."""

    kind = "char"
    eot = None

    def __init__(self, symbols: str):
        self.symbols = "".join(sorted(set(symbols)))
        self.vocab_size = len(self.symbols)
        self._points = _code_points(self.symbols)

    @classmethod
    def fit(cls, texts: Iterable[str]) -> CharTokenizer:
        """The vocabulary of every character in ``texts``."""
        return cls("".join(set().union(*map(set, texts))))

    @classmethod
    def load(cls, path: Path) -> CharTokenizer:
        try:
            symbols = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} does not hold a char vocabulary ({exc}): prepare the corpus again") from exc
        if not isinstance(symbols, str) or not symbols:
            raise ConfigError(f"{path} must hold the char vocabulary as one JSON string: prepare the corpus again")
        return cls(symbols)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        out = []
        for text in texts:
            points = _code_points(text)
            ids = np.minimum(np.searchsorted(self._points, points), self.vocab_size - 1)
            unknown = np.flatnonzero(self._points[ids] != points)
            if unknown.size:
                raise ValueError(f"character {text[unknown[0]]!r} is not in the char vocabulary "
                                 "(built from the corpus)")
            out.append(ids)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self._points[_checked(ids, self.vocab_size)].astype("<u4").tobytes().decode("utf-32-le")

    def save(self, folder: Path) -> None:
        (folder / CHARS_FILE).write_text(json.dumps(self.symbols), encoding="utf-8")


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers.Tokenizer``: one trained here (bpe) or read from a file (json)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, kind: str):
        self.kind = kind
        self._tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eot = tokenizer.token_to_id(EOT)

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
        """Read a tokenizer.json; ConfigError naming the file when it is missing or does not parse."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise ConfigError(f"tokenizer file {path} does not exist: set data.tokenizer to "
                              f"{', '.join(NAMES)} or the path of a tokenizer.json")
        try:
            return cls(tokenizers.Tokenizer.from_file(str(path)), kind)
        except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"{path} does not parse as a Hugging Face tokenizer.json ({reason}): "
                              "point data.tokenizer at a file saved by tokenizers.Tokenizer.save") from exc

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(encoding.ids, dtype=np.int64) for encoding in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(_checked(ids, self.vocab_size).tolist(), skip_special_tokens=False)

    def save(self, folder: Path) -> None:
        self._tokenizer.save(str(folder / JSON_FILE))


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


def _checked(ids: Sequence[int], vocab_size: int) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
    return ids


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
