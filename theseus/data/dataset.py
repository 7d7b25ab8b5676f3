"""A prepared corpus, ready to train on: ``open_dataset(cfg)`` and its batch loaders.

    ds = open_dataset(configure(DataConfig))
    loader = ds.loader("train", seq_len=256, batch_size=32, seed=0)
    batch = next(loader)  # int32 [32, 257]
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from theseus.config import ConfigError
from theseus.data.config import DataConfig, check_documents, check_path
from theseus.data.loader import Loader
from theseus.data.mixture import Mixture
from theseus.data.prepare import prepare
from theseus.data.shards import META_FILE, SPLITS, ShardMeta, read_meta, read_tokens
from theseus.data.tokenizer import NAMES, ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer


@dataclasses.dataclass(frozen=True)
class TokenDataset:
    """A tokenizer and the memory-mapped train/val tokens of one shard folder."""

    folder: Path
    meta: ShardMeta
    tokenizer: Tokenizer
    tokens: dict[str, np.ndarray] = dataclasses.field(repr=False)

    @property
    def vocab_size(self) -> int:
        return self.meta.vocab_size

    @property
    def bytes_per_token(self) -> float | None:
        """Average UTF-8 bytes of text per token (for bits per byte); None when unknown."""
        return self.meta.bytes_per_token

    def n_tokens(self, split: str) -> int:
        return len(self._split(split))

    def loader(self, split: str, seq_len: int, batch_size: int, seed: int,
               process_index: int = 0, process_count: int = 1, prefetch: int = 8) -> Loader:
        """Batches int32 ``[batch_size, seq_len + 1]`` of ``split``: ``batch_size`` is this process's
        share, ``process_index`` of ``process_count``, of each global batch."""
        tokens = self.split_tokens(split, seq_len)
        return Loader(tokens, seq_len, batch_size, seed, process_index, process_count, split=split, prefetch=prefetch)

    def split_tokens(self, split: str, seq_len: int, name: str | None = None) -> np.ndarray:
        """The tokens of ``split``; ConfigError (naming the mixture's source ``name``, if any) when
        they cannot fill one window of ``seq_len + 1``."""
        tokens = self._split(split)
        if len(tokens) < seq_len + 1:
            where = self.folder if name is None else f"{name} ({self.folder})"
            raise ConfigError(f"the {split} split of {where} holds {len(tokens)} tokens, fewer than "
                              f"seq_len + 1 = {seq_len + 1}: lower architecture.seq_len or give data.val_fraction more")
        return tokens

    def _split(self, split: str) -> np.ndarray:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        return self.tokens[split]


def open_dataset(cfg: DataConfig) -> TokenDataset | Mixture:
    """The dataset ``cfg`` describes, prepared first if needed (with progress); ConfigError on bad input.

    ``data.source=shards`` opens the folder ``data.path`` as it is; its tokenizer is the one its
    meta.json records (``data.tokenizer`` must name it), or the tokenizer.json ``data.tokenizer`` gives.
    With ``data.mixture``, a Mixture of each source opened so (each prepared and cached on its own,
    shared with any run of that source alone).
    """
    if cfg.mixture:
        sources = cfg.sources()
        for name, (source, _) in sources.items():
            check_path(f"data.mixture.{name}", source.path)
        return Mixture({name: open_source(c) for name, (c, _) in sources.items()},
                       {name: weight for name, (_, weight) in sources.items()})
    return open_source(cfg)


def planned_vocab_size(cfg: DataConfig, declared: int | None = None) -> int:
    """The vocabulary a run of ``cfg`` trains with, known without its corpus (a planned run reads
    none): byte's 257, a tokenizer.json's own, bpe's ``data.bpe_vocab_size`` (what it is trained
    to). ``char`` is fitted to the corpus: ``declared`` (architecture.vocab_size) stands for it,
    else ConfigError."""
    if cfg.tokenizer not in NAMES:
        return HFTokenizer.from_file(cfg.tokenizer).vocab_size
    if cfg.tokenizer == "byte":
        return ByteTokenizer.vocab_size
    if cfg.tokenizer == "bpe":
        return cfg.bpe_vocab_size
    if declared is None:
        raise ConfigError("data.tokenizer=char is fitted to the corpus, which a planned run (mesh.target) does not "
                          "read: set architecture.vocab_size, or use data.tokenizer=byte, bpe or a tokenizer.json")
    return declared


def open_source(cfg: DataConfig) -> TokenDataset:
    """One source's dataset (``data.source``, ``data.path``), prepared first if needed."""
    check_documents(cfg)
    folder = _shard_folder(cfg.path) if cfg.source == "shards" else prepare(cfg)
    meta = read_meta(folder)
    tokens = read_tokens(folder, meta)
    return TokenDataset(folder, meta, _tokenizer(cfg.tokenizer, folder, meta), tokens)


def _shard_folder(path: str | None) -> Path:
    if path is None:
        raise ConfigError("data.source=shards needs data.path: set it to a folder of train.bin, val.bin and meta.json")
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"data.path={path} is not a folder: set it to a folder of train.bin, val.bin and meta.json")
    return folder


def _tokenizer(name: str, folder: Path, meta: ShardMeta) -> Tokenizer:
    """``data.tokenizer`` resolved against what the shards were made with."""
    if name not in NAMES:
        tokenizer, where = HFTokenizer.from_file(name), name
    elif name == meta.tokenizer:
        tokenizer, where = load_tokenizer(folder, name), f"the {name} tokenizer"
    else:
        fix = meta.tokenizer if meta.tokenizer in NAMES else "the path of their tokenizer.json"
        raise ConfigError(f"data.tokenizer={name} but {folder / META_FILE} says the shards were tokenized with "
                          f"{meta.tokenizer!r}: set data.tokenizer to {fix}")
    if tokenizer.vocab_size != meta.vocab_size:
        raise ConfigError(f"{where} has {tokenizer.vocab_size} tokens but {folder / META_FILE} says vocab_size "
                          f"{meta.vocab_size}: use the tokenizer the shards were made with")
    return tokenizer
