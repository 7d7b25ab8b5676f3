"""A weighted mixture of prepared corpora (``data.mixture``): one tokenizer, batches drawn by weight.

The global stream of sequences is cut into blocks of ``BLOCK``; block ``b`` holds exactly
``counts[k]`` sequences of source ``k`` (``BLOCK * weight_k``, rounded by largest remainder) in
the order of a permutation drawn from ``(seed, b)`` (Levanter's block-deterministic mixing). The
``j``-th sequence of source ``k`` is window ``j`` of that source's own epoch-shuffled stream
(``Windows``). So a sequence, and a batch, is a pure function of (seed, position) exactly as in
the plain loader: the same ``Loader`` thread, state and resume, and the same split between
processes; any run of ``BLOCK`` sequences holds each source's share to within one sequence.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from theseus.config import ConfigError
from theseus.data.loader import Loader, Windows
from theseus.data.shards import ShardMeta
from theseus.data.tokenizer import Tokenizer

BLOCK = 1024  # sequences per block of exact shares
TAG = 0x6D6978  # "mix": the mixture's draws never coincide with a source's epoch draws


def block_counts(weights: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """Sequences of each source per block: ``block * weights`` (normalised) rounded so they sum to
    ``block``, the largest remainders rounded up."""
    exact = block * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(counts - exact, kind="stable")[: block - counts.sum()]] += 1
    return counts


class MixtureWindows:
    """The batches of one process from several sources: ``batch(position) -> int32 [batch_size, seq_len + 1]``.

    ``sources``: one ``Windows`` per source (batch 1, one process: a stream of windows);
    ``weights``: their relative weights.
    """

    def __init__(self, sources: list[Windows], weights: list[float], batch_size: int, seed: int,
                 process_index: int = 0, process_count: int = 1):
        if not 0 <= process_index < process_count or batch_size < 1:
            raise ValueError(f"need batch_size >= 1 and 0 <= process_index < process_count, got "
                             f"{batch_size}, {process_index}, {process_count}")
        self.sources, self.weights = sources, list(weights)
        self.seq_len, self.batch_size, self.seed = sources[0].seq_len, batch_size, seed
        self.stride = batch_size * process_count
        self.first = batch_size * process_index
        self.counts = block_counts(np.asarray(weights, dtype=np.float64))
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, rank)`` of block ``b``'s sequences: which source each is drawn from, and how
        many of that source's sequences come before it in the block."""
        source = np.random.default_rng((self.seed, TAG, b)).permutation(np.repeat(np.arange(len(self.counts)),
                                                                                  self.counts))
        rank = np.empty(BLOCK, dtype=np.int64)
        for k in range(len(self.counts)):
            rank[source == k] = np.arange(self.counts[k])
        return source, rank

    def assign(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source, window)`` of the global stream positions ``index``: the source of each sequence
        and its position in that source's own stream of windows."""
        blocks, within = np.divmod(index, BLOCK)
        cached = self._blocks  # read and written once: the producer and the consumer may both gather
        in_use = {b: cached[b] if b in cached else self.block(b) for b in np.unique(blocks).tolist()}
        self._blocks = in_use
        source = np.empty(len(index), dtype=np.int64)
        window = np.empty(len(index), dtype=np.int64)
        for b, (block_source, block_rank) in in_use.items():
            here = blocks == b
            source[here] = block_source[within[here]]
            window[here] = b * self.counts[source[here]] + block_rank[within[here]]
        return source, window

    def batch(self, position: int) -> np.ndarray:
        source, window = self.assign(position + self.first + np.arange(self.batch_size))
        out = np.empty((self.batch_size, self.seq_len + 1), dtype=np.int32)
        for k, windows in enumerate(self.sources):
            mine = source == k
            if mine.any():
                out[mine] = windows.rows(window[mine])
        return out

    def identity(self) -> dict:
        return {"seed": self.seed, "seq_len": self.seq_len, "weights": self.weights}


class Source(Protocol):
    """What a mixture needs of each source: a ``theseus.data.dataset.TokenDataset``."""

    meta: ShardMeta
    tokenizer: Tokenizer
    vocab_size: int
    bytes_per_token: float | None

    def n_tokens(self, split: str) -> int: ...

    def split_tokens(self, split: str, seq_len: int, name: str | None = None) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class Mixture:
    """Several prepared corpora with one tokenizer, and their relative weights (normalised here)."""

    sources: dict[str, Source]
    weights: dict[str, float]

    def __post_init__(self):
        total = sum(self.weights.values())
        object.__setattr__(self, "weights", {name: w / total for name, w in self.weights.items()})
        first, *others = self.sources.items()
        for name, dataset in others:
            if (dataset.meta.tokenizer, dataset.vocab_size) != (first[1].meta.tokenizer, first[1].vocab_size):
                raise ConfigError(f"data.mixture.{name} was tokenized with {dataset.meta.tokenizer} "
                                  f"({dataset.vocab_size} tokens) but data.mixture.{first[0]} with "
                                  f"{first[1].meta.tokenizer} ({first[1].vocab_size}): "
                                  "every source needs one tokenizer")

    @property
    def tokenizer(self) -> Tokenizer:
        return next(iter(self.sources.values())).tokenizer

    @property
    def vocab_size(self) -> int:
        return next(iter(self.sources.values())).vocab_size

    @property
    def bytes_per_token(self) -> float | None:
        """Average UTF-8 bytes per token of the mixture's draws; None when a source's is unknown."""
        known = [dataset.bytes_per_token for dataset in self.sources.values()]
        if None in known:
            return None
        return sum(self.weights[name] * bpt for name, bpt in zip(self.sources, known, strict=True))

    def n_tokens(self, split: str) -> int:
        """The tokens of the smallest source's ``split``: each source must fill a window."""
        return min(dataset.n_tokens(split) for dataset in self.sources.values())

    def loader(self, split: str, seq_len: int, batch_size: int, seed: int,
               process_index: int = 0, process_count: int = 1, prefetch: int = 8) -> Loader:
        """Batches int32 ``[batch_size, seq_len + 1]`` of ``split`` drawn from every source by weight;
        ``batch_size`` is this process's share, ``process_index`` of ``process_count``."""
        windows = [Windows(dataset.split_tokens(split, seq_len, f"data.mixture.{name}"), seq_len, 1, seed)
                   for name, dataset in self.sources.items()]
        mixed = MixtureWindows(windows, list(self.weights.values()), batch_size, seed, process_index, process_count)
        return Loader.over(mixed, split=split, prefetch=prefetch)
