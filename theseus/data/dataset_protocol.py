"""``Dataset``: what a task's data gives the trainer, the evaluations and the task itself.

Five kinds implement it: token windows of one corpus (``TokenDataset``) or of a ``Mixture``,
task=sft's ``Conversations``, task=dpo's ``Preferences`` and task=grpo's ``Prompts``.
``LossTask.dataset(data)`` says which a task reads::

    dataset = task.dataset(data)
    loader = dataset.loader("train", seq_len=256, batch_size=8, seed=0)
    batch = next(loader)  # the task's examples, [8, *task.example(256).shape] (a dict of them for dpo)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from theseus.data.loader import Loader
from theseus.data.tokenizer import Tokenizer


@runtime_checkable
class Dataset(Protocol):
    """A task's data: its tokenizer and vocabulary, and batches of its examples by split."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def bytes_per_token(self) -> float | None:
        """Average UTF-8 bytes of text per token (bits per byte); None where no text is scored whole."""

    def loader(self, split: str, seq_len: int, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, prefetch: int = 8) -> Loader:
        """Batches of ``split`` (``train``, ``val``) for windows of ``seq_len + 1`` tokens:
        ``batch_size`` examples, this process's share, ``process_index`` of ``process_count``,
        of each global batch, in an order drawn by ``seed``."""


@runtime_checkable
class WholeValidation(Dataset, Protocol):
    """A dataset whose validation split an evaluation scores whole, every example once
    (conversations, preference pairs), instead of a few random batches."""

    def validation(self, seq_len: int, batch_size: int, process_index: int = 0, process_count: int = 1,
                   split: str = "val") -> Iterator[tuple[Any, int]]:
        """``(batch, n)`` per global batch of ``batch_size`` examples of ``split``: this process's
        share of it (the last padded), and what the whole global batch holds (its weight)."""
