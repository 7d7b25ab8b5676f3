"""Data settings: where the corpus comes from, how it is tokenized and split."""

from __future__ import annotations

import dataclasses

from theseus.config import Configurable, field, register


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
