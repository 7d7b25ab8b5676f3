"""Data settings: where the corpus comes from, how it is tokenized and split."""

from __future__ import annotations

import dataclasses

from theseus.config import ConfigError, Configurable, field, register


@register("data", "default")
@dataclasses.dataclass(frozen=True)
class DataConfig(Configurable):
    source: str = field("data/source", default="stdlib", choices=("stdlib", "text", "shards"),
                        help="stdlib: this Python's own source files; text: local files (data.path); shards: pre-tokenized .bin files")
    path: str | None = field("data/path", default=None, help="a file, folder or glob (text), or a shard folder (shards)")
    tokenizer: str = field("data/tokenizer", default="byte", help="byte, char, bpe, or a path to a tokenizer.json")
    val_fraction: float = field("data/val_fraction", default=0.01, help="fraction of the corpus held out for validation")
    seed: int = field("data/seed", default=0, help="seed of the train/val split and the batch order")
    cache_dir: str = field("data/cache_dir", default="~/.cache/theseus", help="where prepared shards are kept")
    bpe_vocab_size: int = field("data/bpe_vocab_size", default=8192,
                                help="vocabulary size the bpe tokenizer is trained to")
    max_files: int | None = field("data/max_files", default=None,
                                  help="use only the first N files of the corpus (stdlib, text)")
    prefetch: int | None = field("data/prefetch", default=None,
                                 help="batches a thread gathers ahead; None: 8 on accelerators, 0 on CPU (no thread)")

    def __post_init__(self):
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}: "
                              f"runs evaluate on that held-out part, e.g. data.val_fraction=0.01")
        if self.tokenizer == "bpe" and self.bpe_vocab_size <= 257:
            raise ConfigError(f"data.bpe_vocab_size={self.bpe_vocab_size} leaves no merges "
                              "(256 bytes + <|endoftext|> come first): set it above 257, e.g. 8192")
        if self.prefetch is not None and self.prefetch < 0:
            raise ConfigError(f"data.prefetch must be 0 (no thread) or more, got {self.prefetch}")
        if self.max_files is not None and self.max_files < 1:
            raise ConfigError(f"data.max_files must be at least 1 (or unset for every file), got {self.max_files}")
