"""``python -m theseus.data.prepare [data.* overrides, or any run's overrides]``: a corpus
tokenized into its train/val shards in the cache (``theseus.data.prepare``), before any run."""

from __future__ import annotations

import sys

from theseus.config import ConfigError, configured
from theseus.config.compose import compose
from theseus.data.config import DataConfig, check_documents
from theseus.data.prepare import prepare
from theseus.data.shards import read_meta


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = configured(DataConfig, compose(argv))
        check_documents(cfg, fix="a run with task=sft prepares its conversations itself: drop data.chat_template")
        folder = prepare(cfg)
        meta = read_meta(folder)
    except ConfigError as exc:
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    print(f"{folder}: {meta.counts['train']:,} train + {meta.counts['val']:,} val tokens, "
          f"{meta.tokenizer} vocabulary of {meta.vocab_size:,}")
    return 0
