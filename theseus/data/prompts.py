"""Prompt rows for reinforcement learning (``task=grpo``): each row's prompt tokenized as TRL's
``GRPOTrainer`` tokenizes it, its other columns kept for the reward functions, split, and drawn
a step's prompts at a time.

    prompts = Prompts.read(data, template, num_generations=8, completion_length=64)
    loader = prompts.loader("train", seq_len=256, batch_size=32, seed=0)   # 32 completions: 4 prompts
    rows = next(loader)                                                     # int32 [4]: rows of prompts.rows

Rows (``data.source=jsonl|parquet|arrow``)::

    {"prompt": "What is 2 + 3?", "answer": "5"}                                # standard
    {"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5"}  # conversational

A standard prompt is ``tokenizer(prompt)`` (with the BOS a tokenizer adds); a conversational one
the chat template's rendering with the generation prompt, tokenized with no token added
(transformers' ``apply_chat_template(..., add_generation_prompt=True, tokenize=True)``). A
completion ends at the tokenizer's end of text or, for a conversation, the template's end of
turn (``stop_tokens``). A prompt with no room left for ``completion_length`` tokens in the window
(``architecture.seq_len + 1``) is dropped and counted, never cut. The loader gives the rows of
this process's prompts of each step, ``batch_size / num_generations`` of them, in an order drawn
from ``(seed, epoch)``: its state is its position, as a token loader's.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from theseus.config import ConfigError
from theseus.data.chat import ChatTemplate, check_messages, tokenize
from theseus.data.config import DataConfig
from theseus.data.corpus_files import rows_files
from theseus.data.loader import Loader
from theseus.data.records import read_batches
from theseus.data.tokenizer import NAMES, ByteTokenizer, HFTokenizer, Tokenizer

PROMPT_SOURCES = ("jsonl", "parquet", "arrow")
PROMPT = "prompt"


@dataclasses.dataclass(frozen=True)
class Prompts:
    """Every prompt row, tokenized, and the split of them into train and val."""

    tokenizer: Tokenizer
    rows: list[dict] = dataclasses.field(repr=False)  # each row as read: its prompt and columns
    ids: list[np.ndarray] = dataclasses.field(repr=False)  # each row's prompt tokens, int32
    split: dict[str, list[int]] = dataclasses.field(repr=False)  # rows of train and val
    stop_tokens: tuple[int, ...]  # what ends a completion
    num_generations: int  # completions per prompt
    completion_length: int  # tokens a completion may take
    seed: int = 0
    bytes_per_token = None  # no bits per byte: nothing is scored by likelihood
    _fitting: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)  # (split, seq_len) -> rows

    @classmethod
    def read(cls, data: DataConfig, num_generations: int, completion_length: int) -> Prompts:
        """``data``'s prompt rows, tokenized and split (``data.val_fraction``, ``data.seed``).
        ConfigError, naming the file and row, for a row without a prompt, a prompt neither a string
        nor messages, a conversation with no chat template, or fewer than two rows."""
        files = prompt_files(data)
        tokenizer = prompt_tokenizer(data)
        rows = list(prompt_rows(data, files))
        if len(rows) < 2:
            raise ConfigError(f"data.path={data.path} holds {len(rows)} prompt row(s): task=grpo needs at least two "
                              "(one is held out for validation)")
        kinds = {isinstance(row[PROMPT], str) for row, _ in rows}
        if len(kinds) > 1:
            raise ConfigError(f"data.path={data.path} mixes prompts that are strings with prompts that are messages: "
                              "give every row one kind")
        conversational = kinds == {False}
        template = ChatTemplate.find(data.tokenizer, data.chat_template) if conversational else None
        ids = [prompt_ids(tokenizer, template, row[PROMPT]) for row, _ in rows]
        stops = [tokenizer.eot] if tokenizer.eot is not None else []
        if template is not None:
            stops.append(template.end_of_turn(tokenizer))
        order = np.random.default_rng(data.seed).permutation(len(rows))
        held = min(len(rows) - 1, max(1, round(data.val_fraction * len(rows))))
        split = {"val": sorted(map(int, order[:held])), "train": sorted(map(int, order[held:]))}
        return cls(tokenizer, [row for row, _ in rows], ids, split, tuple(dict.fromkeys(stops)), num_generations,
                   completion_length, data.seed)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def conversational(self) -> bool:
        """Whether the prompts are messages (every row's kind is the same), not strings."""
        return not isinstance(self.rows[0][PROMPT], str)

    def n_tokens(self, split: str) -> int:
        """The prompts' tokens in ``split``."""
        return sum(len(self.ids[i]) for i in self.split[split])

    def fitting(self, split: str, seq_len: int) -> list[int]:
        """The rows of ``split`` whose prompt leaves ``completion_length`` tokens of the window of
        ``seq_len + 1``; ConfigError when none does, the others counted on stderr (once)."""
        key = (split, seq_len)
        if key not in self._fitting:
            room = seq_len + 1 - self.completion_length
            rows = [i for i in self.split[split] if len(self.ids[i]) <= room]
            if not rows:
                shortest = min(len(self.ids[i]) for i in self.split[split])
                raise ConfigError(f"no {split} prompt fits architecture.seq_len + 1 = {seq_len + 1} tokens with "
                                  f"grpo.max_completion_length={self.completion_length} after it (the shortest prompt "
                                  f"has {shortest} tokens): raise architecture.seq_len or lower "
                                  f"grpo.max_completion_length")
            if len(rows) < len(self.split[split]):
                print(f"theseus: {split}: dropped {len(self.split[split]) - len(rows)} of {len(self.split[split])} "
                      f"prompts longer than {room} tokens (seq_len + 1 - grpo.max_completion_length)", file=sys.stderr)
            self._fitting[key] = rows
        return self._fitting[key]

    def loader(self, split: str, seq_len: int, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, prefetch: int = 0) -> Loader:
        """This process's prompts of each step: int32 ``[batch_size / num_generations]`` rows of
        ``rows`` (``batch_size`` counts completions, as ``trainer.batch_size`` does)."""
        order = PromptOrder(self.fitting(split, seq_len), batch_size // self.num_generations, seed, process_index,
                            process_count)
        return Loader.over(order, split=split, prefetch=0)  # microseconds a batch: no thread

    @property
    def column_names(self) -> list[str]:
        """The rows' columns but the prompt (every row's, in order): what reward functions are given by name."""
        return list(dict.fromkeys(name for row in self.rows for name in row if name != PROMPT))

    def columns(self, rows: np.ndarray) -> dict[str, list]:
        """Every column but the prompt, for ``rows``, by name: what reward functions are given."""
        names = [name for name in self.rows[int(rows[0])] if name != PROMPT] if len(rows) else []
        return {name: [self.rows[int(row)].get(name) for row in rows] for name in names}


class PromptOrder:
    """The prompts of one process, step by step (``Loader.over`` reads ``batch``, ``stride``, ``identity``)."""

    def __init__(self, rows: list[int], batch_size: int, seed: int, process_index: int = 0, process_count: int = 1):
        self.rows, self.batch_size, self.seed = np.asarray(rows, np.int32), batch_size, seed
        self.stride = batch_size * process_count
        self.first = batch_size * process_index

    def batch(self, position: int) -> np.ndarray:
        """int32 ``[batch_size]``: this process's prompts of the step at stream ``position``, each
        epoch a permutation of the rows drawn from ``(seed, epoch)``."""
        epochs, within = np.divmod(position + self.first + np.arange(self.batch_size), len(self.rows))
        orders = {int(e): np.random.default_rng((self.seed, int(e))).permutation(self.rows) for e in np.unique(epochs)}
        return np.asarray([orders[int(e)][w] for e, w in zip(epochs, within)], np.int32)

    def identity(self) -> dict:
        return {"seed": self.seed, "prompts": len(self.rows)}


def prompt_files(data: DataConfig) -> list[Path]:
    """The files of ``data``'s prompt rows; ConfigError for another source, or a mixture."""
    return rows_files(data, "grpo", "prompt rows", PROMPT_SOURCES,
                      "jsonl, parquet or arrow (rows with a prompt: a string or a list of messages)")


def prompt_tokenizer(data: DataConfig) -> Tokenizer:
    """byte's or a tokenizer.json's: a completion may hold what no prompt does, so a vocabulary
    fitted to the prompts (char, bpe) is refused."""
    if data.tokenizer == "byte":
        return ByteTokenizer()
    if data.tokenizer in NAMES:
        raise ConfigError(f"task=grpo samples completions, which a data.tokenizer={data.tokenizer} fitted to the "
                          "prompts may not express: use data.tokenizer=byte or the path of a tokenizer.json (a "
                          "trainer.init_from folder's is used by default)")
    return HFTokenizer.from_file(data.tokenizer)


def prompt_rows(data: DataConfig, files: list[Path]) -> Iterator[tuple[dict, str]]:
    """Each row of ``files`` with where it is (``FILE line N``), its prompt checked."""
    unit = "line" if data.source == "jsonl" else "row"
    for file in files:
        for batch in read_batches(file, data.source):
            for row, number in zip(batch.rows, batch.numbers):
                where = f"{file} {unit} {number}"
                if not isinstance(row, Mapping) or PROMPT not in row:
                    have = ", ".join(map(repr, row)) if isinstance(row, Mapping) else type(row).__name__
                    raise ConfigError(f"{where} has no field 'prompt' (it has {have or 'none'}): task=grpo reads "
                                      "rows of a prompt (a string or messages) and the columns the rewards read")
                prompt = row[PROMPT]
                if not isinstance(prompt, str):
                    prompt = check_messages(prompt, f"{where}, field 'prompt',")
                yield {**row, PROMPT: prompt}, where


def prompt_ids(tokenizer: Tokenizer, template: ChatTemplate | None, prompt: str | list[dict]) -> np.ndarray:
    """int32 ``[n]``: a standard prompt encoded with the tokens the tokenizer adds (a BOS), or a
    conversation rendered with the generation prompt and encoded with none added."""
    if isinstance(prompt, str):
        return np.asarray(tokenizer.encode(prompt, special=True), np.int32)
    text, _ = template.render(prompt, add_generation_prompt=True)
    return tokenize(tokenizer, text)[0]
