"""Data settings: where the corpus comes from (one source, or a weighted mixture of several),
how it is tokenized and split."""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Mapping

from theseus.config import SEED, ConfigError, Configurable, Range, field


SOURCES = ("stdlib", "text", "shards", "jsonl", "parquet", "arrow")
MIXTURE_KEYS = ("source", "path", "weight", "text_field", "split")  # the last two: optional, per source


@dataclasses.dataclass(frozen=True)
class DataConfig(Configurable):
    source: str = field("data.source", default="stdlib", choices=SOURCES,
                        help="stdlib: this Python's own source files; text: local files (data.path); "
                             "shards: pre-tokenized .bin files; jsonl (.gz, .zst too), parquet, arrow (a datasets save_to_disk folder): "
                             "one document per row")
    path: str | None = field("data.path", default=None,
                             help="a file, folder or glob (text, jsonl, parquet), a save_to_disk folder (arrow), "
                                  "or a shard folder (shards)")
    text_field: str = field("data.text_field", default="text",
                            help="the field (jsonl) or column (parquet, arrow) holding each document's text")
    split: str = field("data.split", default="train", help="the split of a DatasetDict's save_to_disk folder (arrow)")
    tokenizer: str = field("data.tokenizer", default="byte",
                           help="byte, char, bpe, or a path to a tokenizer.json or a GGUF file")
    val_fraction: float = field(
        "data.val_fraction", default=0.01,
        check=Range(gt=0, lt=1, fix="runs evaluate on that held-out part, e.g. data.val_fraction=0.01"),
        help="fraction of the corpus held out for validation")
    seed: int = field("data.seed", default=0, help="seed of the train/val split and the batch order", role=SEED)
    cache_dir: str = field("data.cache_dir", default="~/.cache/theseus", help="where prepared shards are kept",
                           resumable=True)
    bpe_vocab_size: int = field("data.bpe_vocab_size", default=8192,
                                help="vocabulary size the bpe tokenizer is trained to")
    max_files: int | None = field("data.max_files", default=None,
                                  check=Range(ge=1, says="at least 1 (or unset for every file)"), help="use only the first N files of the corpus (stdlib, text)")
    mixture: dict = field("data.mixture", default={},
                          help="NAME: {source, path, weight}: train on several corpora, drawn by weight "
                               "(data.source and data.path then only serve interpolations)")
    prefetch: int | None = field("data.prefetch", default=None, check=Range(ge=0, says="0 (no thread) or more"),
                                 help="batches a thread gathers ahead; None: 8 on accelerators, 0 on CPU (no thread)")
    # task=sft: conversations (theseus.tasks.sft)
    chat_field: str = field("data.chat_field", default="messages", help="task=sft: the field of a row holding its messages")
    train_on: str = field("data.train_on", default="assistant", choices=("assistant", "all"),
                          help="task=sft: the loss on the assistant's tokens, or on all from position 1")
    packing: bool = field("data.packing", default=True,
                          help="task=sft: several conversations per window, attention confined to each; false: one, padded")
    chat_template: str | None = field("data.chat_template", default=None,
                                      help="task=sft: a Jinja chat template file (or a tokenizer_config.json holding "
                                           "one); None: the tokenizer's, theseus's for byte")

    def __post_init__(self):
        super().__post_init__()  # each field within its declared range
        if self.tokenizer == "bpe" and self.bpe_vocab_size <= 257:
            raise ConfigError(f"data.bpe_vocab_size={self.bpe_vocab_size} leaves no merges "
                              "(256 bytes + <|endoftext|> come first): set it above 257, e.g. 8192")
        for name, entry in self.mixture.items():
            check_source(f"data.mixture.{name}", entry)
        if self.mixture and self.tokenizer in ("char", "bpe"):
            raise ConfigError(f"data.mixture needs one tokenizer for every source, but data.tokenizer={self.tokenizer} "
                              "is fitted to each corpus: use data.tokenizer=byte or the path of a tokenizer.json")

    def sources(self) -> dict[str, tuple[DataConfig, float]]:
        """The mixture's sources, NAME -> (its settings, its weight); each shares every setting
        (tokenizer, val_fraction, cache) but source and path, and text_field and split where it gives
        them. Empty without a mixture."""
        return {str(name): (dataclasses.replace(self, source=entry["source"], path=entry.get("path"), mixture={},
                                                text_field=entry.get("text_field", self.text_field),
                                                split=entry.get("split", self.split)),
                            float(entry["weight"]))
                for name, entry in self.mixture.items()}


def check_documents(cfg: DataConfig, fix: str = "add task=sft, or drop data.chat_template") -> None:
    """ConfigError when a corpus read as documents is given ``data.chat_template``, which renders
    the conversations of task=sft (unused, it would hide a task left out)."""
    if cfg.chat_template is not None:
        raise ConfigError(f"data.chat_template={cfg.chat_template} renders the conversations of task=sft, but "
                          f"this reads data.path as documents (data.text_field): {fix}")


def check_source(key: str, entry: object) -> None:
    """ConfigError naming ``KEY.FIELD`` unless ``entry`` is ``{source, path, weight}`` with a known
    source, a positive weight, and a path where the source reads one (whether it exists is
    ``check_path``'s, when the source is read: a planned run reads none), and optionally a
    ``text_field`` and ``split`` that are strings."""
    example = f"{key}={{source: text, path: corpus.txt, weight: 0.5}}"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{key} must be a mapping of source, path and weight, got {entry!r}: e.g. {example}")
    unknown = sorted(set(entry) - set(MIXTURE_KEYS))
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]} is not a mixture key: a source takes only {', '.join(MIXTURE_KEYS)}")
    source, path, weight = (entry.get(k) for k in ("source", "path", "weight"))
    if source not in SOURCES:
        raise ConfigError(f"{key}.source={source!r} is not a source: use one of {', '.join(SOURCES)}")
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ConfigError(f"{key}.weight must be a positive number, got {weight!r}: e.g. {key}.weight=0.5")
    if not weight > 0:
        raise ConfigError(f"{key}.weight must be positive, got {weight}: drop the source, or give it a share")
    for optional in ("text_field", "split"):
        if optional in entry and not isinstance(entry[optional], str):
            raise ConfigError(f"{key}.{optional} must be a string, got {entry[optional]!r}")
    if source == "stdlib":
        return
    if path is None:
        raise ConfigError(f"{key}.path is missing: source {source} reads a file, folder or glob there")


def check_path(key: str, path: str | None) -> None:
    """ConfigError naming ``KEY.path`` unless ``path`` (a source's; None for stdlib) exists or is a glob."""
    if path is not None and not glob.has_magic(str(path)) and not os.path.exists(os.path.expanduser(str(path))):
        raise ConfigError(f"{key}.path={path} does not exist: point it at a file, a folder or a glob")
