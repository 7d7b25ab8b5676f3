"""Conversations ready to fine-tune on: chat rows rendered by a template, split, and packed
into windows: a ``Dataset`` (``theseus.data.dataset_protocol``), as token windows are, with ``n_tokens`` too.

    data = Conversations.encode(rows, template, tokenizer, train_on="assistant", val_fraction=0.1, seed=0)
    loader = data.loader("train", seq_len=256, batch_size=8, seed=0)
    batch = next(loader)  # int32 [8, 3, 257]: tokens, loss mask, segment ids

One example is ``int32 [3, seq + 1]``: row 0 the tokens, row 1 the loss mask (the target at
position t counts when ``mask[t]``), row 2 each position's conversation within the window
(1, 2, ... in order; 0 for padding, whose tokens are 0 and mask 0). With ``packing``, a window
holds as many whole conversations as fit (next-fit, in an order drawn from the seed); without,
one conversation, padded. A conversation longer than ``seq_len + 1`` tokens, or with no token
to train on, is dropped and counted, never cut. As for a token corpus, each epoch visits the
windows in an order drawn from ``(seed, epoch)``: a batch is a pure function of the seed and
its position in the stream, which is the loader's whole state.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cached_property

import numpy as np

from theseus.config import ConfigError
from theseus.data.chat import ChatTemplate, check_messages, encode_rendered
from theseus.data.loader import Loader, in_batches, stack
from theseus.data.shards import SPLITS
from theseus.data.tokenizer import Tokenizer

ROWS = 3  # tokens, loss mask, segment ids


@dataclasses.dataclass(frozen=True)
class Conversations:
    """Each split's encoded conversations: ``(ids int32 [n], mask bool [n])`` pairs."""

    tokenizer: Tokenizer
    splits: dict[str, list[tuple[np.ndarray, np.ndarray]]] = dataclasses.field(repr=False)
    rows: dict[str, list[int]] = dataclasses.field(repr=False)  # each split's rows (0-based, in order)
    packing: bool = True
    seed: int = 0  # of the split and of the order conversations are packed in
    bytes_per_token = None  # no bits per byte: the loss covers part of the text
    _layouts: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)  # (split, seq_len) -> windows

    @classmethod
    def encode(cls, rows: Iterable[Mapping], template: ChatTemplate, tokenizer: Tokenizer, *, chat_field: str = "messages",
               train_on: str = "assistant", val_fraction: float = 0.01, seed: int = 0, packing: bool = True,
               where: str = "the corpus") -> Conversations:
        """Render and tokenize every row's ``chat_field`` (``render_rows``), then ``split`` them."""
        encoded = [encode_rendered(text, spans, tokenizer, train_on)
                   for text, spans in render_rows(rows, template, chat_field, where)]
        return cls.split(encoded, tokenizer, val_fraction=val_fraction, seed=seed, packing=packing, where=where)

    @classmethod
    def split(cls, encoded: list[tuple[np.ndarray, np.ndarray]], tokenizer: Tokenizer, *, val_fraction: float = 0.01,
              seed: int = 0, packing: bool = True, where: str = "the corpus") -> Conversations:
        """The ``encoded`` conversations (in row order), ``val_fraction`` of them (at least one,
        drawn by ``seed``) held out for validation; ConfigError for fewer than two."""
        rows = split_rows(len(encoded), val_fraction, seed, "conversation(s)", where)
        return cls(tokenizer, {split: [encoded[i] for i in held] for split, held in rows.items()}, rows, packing, seed)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def n_tokens(self, split: str) -> int:
        """Tokens of the split's conversations (all of them, those too long for a window too)."""
        return sum(len(ids) for ids, _ in self._split(split))

    def longest(self, split: str) -> int:
        """Tokens of the split's longest conversation."""
        return max((len(ids) for ids, _ in self._split(split)), default=0)

    def n_conversations(self, split: str) -> int:
        return len(self._split(split))

    def windows(self, split: str, seq_len: int, batch_size: int, seed: int, process_index: int = 0,
                process_count: int = 1) -> Windows:
        """The split's conversations laid out in windows of ``seq_len + 1`` (see the module);
        ConfigError when none fits; the dropped ones are counted on stderr (once)."""
        key = (split, seq_len)
        if key not in self._layouts:
            self._layouts[key] = self._layout(split, seq_len)
        return Windows(self._split(split), self._layouts[key], seq_len, batch_size, seed, process_index, process_count)

    def _layout(self, split: str, seq_len: int) -> list[list[int]]:
        conversations = self._split(split)
        fits = [i for i, (ids, mask) in enumerate(conversations) if len(ids) <= seq_len + 1 and mask.any()]
        too_long = sum(len(ids) > seq_len + 1 for ids, _ in conversations)
        untrained = len(conversations) - len(fits) - too_long
        if not any(mask.any() for _, mask in conversations):
            raise ConfigError(f"none of the {len(conversations)} {split} conversations has a token to train on (the "
                              f"template marks no assistant turn in them): give conversations with assistant "
                              f"messages, or set data.train_on=all")
        if not fits:
            raise ConfigError(f"none of the {len(conversations)} {split} conversations fits in architecture.seq_len + 1 = "
                              f"{seq_len + 1} tokens with a token to train on: raise architecture.seq_len "
                              f"(the shortest has {min(len(ids) for ids, _ in conversations)} tokens)")
        if too_long or untrained:
            reasons = [f"{too_long} longer than seq_len + 1 = {seq_len + 1} tokens"] * bool(too_long) + \
                      [f"{untrained} with no token to train on"] * bool(untrained)
            print(f"theseus: {split}: dropped {too_long + untrained} of {len(conversations)} conversations "
                  f"({', '.join(reasons)})", file=sys.stderr)
        if not self.packing:
            return [[i] for i in fits]
        order = np.random.default_rng((self.seed, 0x5F7)).permutation(fits)
        return [[int(order[j]) for j in window] for window in pack([len(conversations[i][0]) for i in order], seq_len + 1)]

    def loader(self, split: str, seq_len: int, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, prefetch: int = 8) -> Loader:
        """Batches int32 ``[batch_size, 3, seq_len + 1]`` of ``split``, this process's share of each
        global batch, as ``TokenDataset.loader`` gives (the same state, resume and prefetching)."""
        windows = self.windows(split, seq_len, batch_size, seed, process_index, process_count)
        return Loader.over(windows, split=split, prefetch=prefetch)

    def validation(self, seq_len: int, batch_size: int, process_index: int = 0, process_count: int = 1,
                   split: str = "val") -> Iterator[tuple[np.ndarray, int]]:
        """Every window of ``split`` (the validation split) once: ``(batch, n)`` per global batch of ``batch_size``
        windows, ``batch`` this process's share (int32 ``[batch_size / process_count, 3, seq_len
        + 1]``, the last padded with empty windows), ``n`` the targets of the whole global batch:
        the mean of the batches' losses weighted by ``n`` is the masked mean over the conversations."""
        windows = self.windows(split, seq_len, batch_size // process_count, self.seed)
        for batch, held in in_batches(range(windows.per_epoch), windows.row, np.zeros((ROWS, seq_len + 1), np.int32),
                                      batch_size, process_index, process_count):
            yield batch, int(sum(windows.row(i)[1, 1:].sum() for i in held))

    def _split(self, split: str) -> list[tuple[np.ndarray, np.ndarray]]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        return self.splits[split]


def split_rows(n: int, val_fraction: float, seed: int, what: str, where: str) -> dict[str, list[int]]:
    """``{"val": [...], "train": [...]}``: ``val_fraction`` of ``n`` rows (at least one, drawn by
    ``seed``) held out for validation, each split's rows in order; ConfigError for fewer than two."""
    check_count(n, what, where)
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(n - 1, max(1, round(val_fraction * n)))
    return {"val": sorted(map(int, order[:n_val])), "train": sorted(map(int, order[n_val:]))}


def pack(lengths: list[int], size: int) -> list[list[int]]:
    """Next-fit: indices into ``lengths`` grouped in order into windows of at most ``size``."""
    windows: list[list[int]] = []
    used = size
    for i, length in enumerate(lengths):
        if used + length > size:
            windows.append([])
            used = 0
        windows[-1].append(i)
        used += length
    return windows


def check_count(n: int, what: str, where: str) -> None:
    """ConfigError unless ``where`` holds at least two of its ``what`` (one is held out)."""
    if n < 2:
        raise ConfigError(f"{where} holds {n} {what}: at least two are needed (one is held out for validation)")


def check_rows(rows: Sequence[Mapping], chat_field: str, train_on: str, where: str) -> None:
    """What can be seen of ``rows`` before they are rendered: at least two, each with its
    messages (``row_messages``), and with ``train_on=assistant`` some assistant message (the loss
    covers those alone). ConfigError."""
    check_count(len(rows), "conversation(s)", where)
    conversations = [row_messages(number, row, chat_field, where) for number, row in enumerate(rows, start=1)]
    if train_on == "assistant" and not any(m["role"] == "assistant" for messages in conversations for m in messages):
        raise ConfigError(f"no conversation of {where} has an assistant message, and the loss covers the assistant's "
                          f"tokens (data.train_on=assistant): give conversations with assistant replies, or set "
                          f"data.train_on=all")


def row_messages(number: int, row: Mapping, chat_field: str, where: str) -> list[dict]:
    """Row ``number``'s messages (its ``chat_field``, checked); ConfigError naming the row."""
    if chat_field not in row:
        raise ConfigError(f"row {number} of {where} has no field {chat_field!r} (it has "
                          f"{', '.join(map(repr, row)) or 'none'}): set data.chat_field to the field of its messages")
    return check_messages(row[chat_field], f"row {number} of {where}, field {chat_field!r},")


def render_rows(rows: Iterable[Mapping], template: ChatTemplate, chat_field: str = "messages",
                where: str = "the corpus") -> Iterator[tuple[str, list[tuple[int, int]]]]:
    """Each row's conversation (its ``chat_field``) rendered by ``template``: its text and the
    character spans of the assistant's turns. ConfigError, naming the row, for a row without one
    or one the template fails on."""
    for number, row in enumerate(rows, start=1):
        messages = row_messages(number, row, chat_field, where)
        try:
            rendered = template.assistant_spans(messages)
        except ConfigError as exc:
            raise ConfigError(f"row {number} of {where}: {exc}") from None
        yield rendered


class Windows:
    """The batches of one process (``Loader.over`` reads ``batch``, ``stride``, ``identity``)."""

    def __init__(self, conversations: list[tuple[np.ndarray, np.ndarray]], layout: list[list[int]], seq_len: int,
                 batch_size: int, seed: int, process_index: int = 0, process_count: int = 1):
        self.conversations, self.layout = conversations, layout
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.stride = batch_size * process_count
        self.first = batch_size * process_index
        self.per_epoch = len(layout)

    @cached_property
    def n_targets(self) -> int:
        """Positions the loss covers in one pass over the windows."""
        return int(sum(self.conversations[i][1].sum() for window in self.layout for i in window))

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((self.seed, epoch)).permutation(self.per_epoch)

    def batch(self, position: int) -> np.ndarray:
        """int32 ``[batch_size, 3, seq_len + 1]``: this process's windows of the step at ``position``."""
        index = position + self.first + np.arange(self.batch_size)
        epochs, within = np.divmod(index, self.per_epoch)
        orders = {int(e): self.order(int(e)) for e in np.unique(epochs)}
        return stack([self.row(int(orders[int(e)][w])) for e, w in zip(epochs, within)])

    def row(self, window: int) -> np.ndarray:
        """int32 ``[3, seq_len + 1]``: window ``window``'s tokens, loss mask and segment ids."""
        out = np.zeros((ROWS, self.seq_len + 1), np.int32)
        at = 0
        for segment, i in enumerate(self.layout[window], start=1):
            ids, mask = self.conversations[i]
            out[0, at:at + len(ids)] = ids
            out[1, at:at + len(ids)] = mask
            out[2, at:at + len(ids)] = segment
            at += len(ids)
        return out

    def identity(self) -> dict:
        return {"seed": self.seed, "seq_len": self.seq_len, "windows": self.per_epoch}
