"""Preference pairs ready to optimise on (``task=dpo``): TRL's preference rows tokenized as TRL's
``DPOTrainer`` tokenizes them, prepared once into the cache, split, and laid out one pair per
example, with a reference model's log-probs of each completion beside the tokens.

    pairs = prepare_pairs(data)             # Preferences: tokenized on the first call, read after
    pairs.cached_reference(seq_len, fingerprint) or pairs.score_reference(seq_len, fingerprint, score, ...)
    loader = pairs.loader("train", seq_len=256, batch_size=8, seed=0)
    batch = next(loader)                    # {"tokens", "completion": int32 [8, 2, 257], "reference": float32 [8, 2]}

Rows (``data.source=jsonl|parquet|arrow``; ``stdlib``: the standard library's docstring pairs,
``theseus.data.docstring_chats``):

    {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}                       # standard
    {"prompt": [{"role": "user", "content": "Hi"}],                                           # conversational
     "chosen": [{"role": "assistant", "content": "Hello!"}], "rejected": [{"role": "assistant", "content": "No."}]}

Standard rows: the tokenizer's end-of-text token is appended to chosen and rejected (as text)
unless they end with it; the prompt is ``tokenizer(prompt)`` (with the BOS a tokenizer adds), a
completion the rest of ``tokenizer(prompt + completion)``. Conversational rows: the prompt is the
chat template's rendering of the prompt with the generation prompt, a completion the rest of the
rendering of prompt + completion (ChatML: the reply, ``<|im_end|>`` and the newline after it).
Where the prompt's tokens are not a prefix of both, the completions begin where they diverge
(TRL's ``common_prefix_length``).

An example is a dict: ``tokens`` int32 [2, seq + 1] (row 0 the chosen sequence, row 1 the
rejected: prompt then completion, 0-padded), ``completion`` int32 [2, seq + 1] (1 on the
completion's tokens), ``reference`` float32 [2] (the reference's log-probs of the two
completions; 0 for a reference-free run). A pair whose longer sequence exceeds ``seq + 1``
tokens is dropped and counted, never cut. An all-zero example (no completion token) is padding.

The cache folder (``data.cache_dir/pairs-SOURCE-TOKENIZER-DIGEST``) holds every row's pair in row
order (``ids.npy``, ``lengths.npy``), the fitted tokenizer and ``meta.json``, keyed as a chat
corpus is (the files, the tokenizer, the template). The reference's log-probs are kept beside it
(``reference-DIGEST/logps.npy``, float32 [pairs, 2], NaN for a pair too long), keyed by the
pairs' folder, ``architecture.seq_len`` and the reference's fingerprint: a sweep over the loss's
settings or the learning rate computes them once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np

from theseus.config import ConfigError
from theseus.data.cache import building
from theseus.data.chat import ChatTemplate, check_messages, tokenize
from theseus.data.chat_corpus import chat_tokenizer, rendered_folder
from theseus.data.config import DataConfig
from theseus.data.conversations import Windows, split_rows
from theseus.data.corpus_files import corpus_files
from theseus.data.docstring_chats import stdlib_pairs
from theseus.data.loader import Loader, in_batches
from theseus.data.progress import progress
from theseus.data.records import read_batches
from theseus.data.tokenizer import NAMES, ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

PAIR_SOURCES = ("stdlib", "jsonl", "parquet", "arrow")
FIELDS = ("prompt", "chosen", "rejected")
FORMAT = 1  # bump when the files of prepared pairs, their tokenization or the reference's files change
META = "meta.json"

Pair = tuple[np.ndarray, np.ndarray, np.ndarray]  # prompt, chosen, rejected: int32 ids


def prepare_pairs(data: DataConfig, reference_free: bool = False) -> Preferences:
    """``data``'s preference pairs, tokenized and split: read from the cache when a start with the
    same settings prepared them, else tokenized and written there. ConfigError (nothing written)
    for a source that holds no pairs, a bad row, chosen equal to rejected in every row.
    ``reference_free``: no reference model, its log-probs 0."""
    files = pair_files(data)
    try:
        template: ChatTemplate | ConfigError = ChatTemplate.find(data.tokenizer, data.chat_template)
    except ConfigError as missing:  # standard rows need none: refused when a conversation needs one
        if data.chat_template is not None:
            raise
        template = missing
    given = None if data.tokenizer in NAMES else HFTokenizer.from_file(data.tokenizer)
    folder = rendered_folder(data, files, None if isinstance(template, ConfigError) else template, "pairs",
                             pairs_format=FORMAT)
    where = "the standard library" if data.source == "stdlib" else f"data.path={data.path}"
    if (folder / META).is_file():
        tokenizer, pairs = read_pairs(folder, given)
        return Preferences(tokenizer, pairs, split_rows(len(pairs), data.val_fraction, data.seed, "pair(s)", where),
                           folder.name, folder.parent, data.seed, reference_free)
    tokenizer, pairs = encode_rows(data, list(pair_rows(data, files)), template, given, where)
    split = split_rows(len(pairs), data.val_fraction, data.seed, "pair(s)", where)  # ConfigError before writing
    with building(folder) as scratch:
        write_pairs(scratch, tokenizer, pairs)
    return Preferences(tokenizer, pairs, split, folder.name, folder.parent, data.seed, reference_free)


def encode_rows(data: DataConfig, rows: list[tuple[Mapping, str]], template: ChatTemplate | ConfigError,
                given: Tokenizer | None, where: str) -> tuple[Tokenizer, list[Pair]]:
    """The tokenizer (``given``, else ``data.tokenizer`` fitted to the rows' text) and every row's
    pair, as TRL tokenizes it (``encode_pair``); ConfigError naming the row for a bad one."""
    checked = [(check_pair(row, at), at) for row, at in rows]  # every row, before any line is shown
    if not checked:
        raise ConfigError(f"{where} holds no preference pairs: give rows of {', '.join(FIELDS)}")
    if all(chosen == rejected for (_, chosen, rejected), _ in checked):
        raise ConfigError(f"every row of {where} has its chosen completion equal to its rejected one: there is "
                          "no preference to learn; check the rejected field")
    with progress(f"dpo: rendering the preference pairs of {where}", len(rows), "pairs") as advance:
        texts = []
        for pair, at in checked:
            texts.append(pair_texts(pair, template, at))
            advance(1)
    tokenizer = given or chat_tokenizer(data, [text for *three, _ in texts for text in three], template)
    eos = end_of_text(tokenizer)
    with progress(f"dpo: tokenizing them ({tokenizer.kind})", len(texts), "pairs") as advance:
        pairs = []
        for prompt, chosen, rejected, standard in texts:
            pairs.append(encode_pair(tokenizer, prompt, chosen, rejected, eos if standard else None))
            advance(1)
    return tokenizer, pairs


def pair_files(data: DataConfig) -> list[Path]:
    """The files ``data``'s pairs come from; ConfigError for a source of another kind, or a mixture."""
    if data.mixture:
        raise ConfigError("task=dpo reads one source of preference pairs: drop data.mixture, set data.source and "
                          "data.path")
    if data.source not in PAIR_SOURCES:
        raise ConfigError(f"task=dpo reads preference pairs, not data.source={data.source}: use data.source=jsonl, "
                          f"parquet or arrow (rows of {', '.join(FIELDS)}), or stdlib (docstring pairs)")
    return corpus_files(data)


def pair_rows(data: DataConfig, files: list[Path]) -> Iterator[tuple[Mapping, str]]:
    """Each row of ``data``'s source with where it is (``FILE line N``, ``FILE row N``)."""
    if data.source == "stdlib":
        for number, row in enumerate(stdlib_pairs(data.max_files), start=1):
            yield row, f"pair {number} of the standard library"
        return
    unit = "line" if data.source == "jsonl" else "row"
    for file in files:
        for batch in read_batches(file, data.source):
            for row, number in zip(batch.rows, batch.numbers):
                yield row, f"{file} {unit} {number}"


def check_pair(row: object, at: str) -> tuple[str | list, str | list, str | list]:
    """``(prompt, chosen, rejected)`` of a row: three strings (standard), or three lists of
    messages (conversational); ConfigError naming ``at`` otherwise."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{at} is not an object of {', '.join(FIELDS)}")
    missing = [name for name in FIELDS if name not in row]
    if missing:
        raise ConfigError(f"{at} has no field {missing[0]!r} (it has {', '.join(map(repr, row)) or 'none'}): a "
                          f"preference row holds {', '.join(FIELDS)}")
    prompt, chosen, rejected = (row[name] for name in FIELDS)
    kind = str if isinstance(prompt, str) else list
    for name in FIELDS:
        if not isinstance(row[name], kind):
            want = "a string, as its prompt is" if kind is str else "a list of messages, as its prompt is"
            raise ConfigError(f"{at}: {name} must be {want}, got {row[name]!r:.80}")
        if kind is list:
            check_messages(row[name], f"{at}: {name}")
    return prompt, chosen, rejected


def pair_texts(pair: tuple, template: ChatTemplate | ConfigError, at: str) -> tuple[str, str, str, bool]:
    """``(prompt, prompt + chosen, prompt + rejected, standard)`` as text: a standard pair's
    strings, or a conversational pair rendered by ``template`` (the prompt with the generation prompt)."""
    prompt, chosen, rejected = pair
    if isinstance(prompt, str):
        return prompt, chosen, rejected, True
    if isinstance(template, ConfigError):
        raise ConfigError(f"{at} is a conversation, which needs a chat template: {template}")
    rendered = template.render(prompt, add_generation_prompt=True)[0]
    return rendered, template.render(prompt + chosen)[0], template.render(prompt + rejected)[0], False


def end_of_text(tokenizer: Tokenizer) -> str:
    """The text of ``tokenizer``'s end-of-text token (TRL appends its ``eos_token`` to standard completions)."""
    if tokenizer.eot is None:
        raise ConfigError(f"the tokenizer ({tokenizer.kind}) has no end-of-text token to end a completion with: "
                          "name one as eos_token in the tokenizer_config.json beside it")
    return tokenizer.as_hf().id_to_token(tokenizer.eot)


def encode_pair(tokenizer: Tokenizer, prompt: str, chosen: str, rejected: str, eos: str | None) -> Pair:
    """TRL's tokenization of one pair: ``prompt``, ``chosen``, ``rejected`` as ``pair_texts`` gives them.

    ``eos``: a standard pair's end-of-text, appended to a completion that does not end with it;
    its texts are tokenized with the tokenizer's added tokens (a BOS), and the completions follow
    the prompt. None: a conversation, whose renderings (prompt with the generation prompt, then
    prompt + each completion) are tokenized as rendered. The prompt is the tokens common to the
    prompt's and both full sequences' beginnings."""
    if eos is not None:
        chosen, rejected = (prompt + (done if done.endswith(eos) else done + eos) for done in (chosen, rejected))
    standard = eos is not None
    ids = [tokenize(tokenizer, text, special=standard)[0] for text in (prompt, chosen, rejected)]
    start = min(common_prefix(ids[0], ids[1]), common_prefix(ids[0], ids[2]))
    return ids[0][:start], ids[1][start:], ids[2][start:]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The number of leading ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def write_pairs(folder: Path, tokenizer: Tokenizer, pairs: list[Pair]) -> None:
    """Every pair's ids back to back (prompt, chosen, rejected), their lengths, the tokenizer and ``META``."""
    lengths = np.asarray([[len(part) for part in pair] for pair in pairs], np.int64)
    np.save(folder / "ids.npy", np.concatenate([part for pair in pairs for part in pair]).astype(np.int32))
    np.save(folder / "lengths.npy", lengths)
    tokenizer.save(folder)
    meta = {"format": FORMAT, "tokenizer": tokenizer.kind, "pairs": len(pairs)}
    (folder / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def read_pairs(folder: Path, given: Tokenizer | None) -> tuple[Tokenizer, list[Pair]]:
    """What ``write_pairs`` wrote: the tokenizer (``given``: a tokenizer.json's) and the pairs, in row order."""
    kind = json.loads((folder / META).read_text(encoding="utf-8"))["tokenizer"]
    lengths = np.load(folder / "lengths.npy", allow_pickle=False)
    parts = np.split(np.load(folder / "ids.npy", allow_pickle=False), np.cumsum(lengths.ravel())[:-1])
    return given or load_tokenizer(folder, kind), [tuple(parts[i:i + 3]) for i in range(0, len(parts), 3)]


def pairs_tokenizer(data: DataConfig) -> Tokenizer:
    """The tokenizer ``prepare_pairs(data)`` uses: byte's or a tokenizer.json's without reading the
    data; char and bpe are fitted to it (the cache keeps them)."""
    if data.tokenizer not in NAMES:
        return HFTokenizer.from_file(data.tokenizer)
    return ByteTokenizer() if data.tokenizer == "byte" else prepare_pairs(data).tokenizer


@dataclasses.dataclass(frozen=True)
class Preferences:
    """Each row's pair and each split's rows; once scored, the reference's log-probs of every pair."""

    tokenizer: Tokenizer
    pairs: list[Pair] = dataclasses.field(repr=False)
    rows: dict[str, list[int]] = dataclasses.field(repr=False)  # each split's pairs (indices, in order)
    key: str = ""  # the pairs' cache folder's name: what they are (files, tokenizer, template)
    cache_dir: Path = Path()
    seed: int = 0  # of the split
    reference_free: bool = False  # no reference: its log-probs are 0
    bytes_per_token = None  # no bits per byte: the loss is not a text's
    # "logps"; (split, seq_len): (the pairs that fit, the line counting the others until it is said)
    _state: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def n_pairs(self, split: str) -> int:
        return len(self._rows(split))

    def longest(self) -> int:
        """The tokens of the longest sequence of any pair."""
        return max(map(self.tokens, range(len(self.pairs))))

    def tokens(self, index: int) -> int:
        """The tokens of pair ``index``'s longer sequence: its prompt and longer completion."""
        prompt, chosen, rejected = self.pairs[index]
        return len(prompt) + max(len(chosen), len(rejected))

    def fitting(self, split: str, seq_len: int, say: bool = False) -> list[int]:
        """The pairs of ``split`` whose longer sequence fits ``seq_len + 1`` tokens; ConfigError when none
        fits. ``say``: the others are counted on stderr, once a split (where its pairs are read)."""
        if (split, seq_len) not in self._state:
            rows = self._rows(split)
            needs = {i: self.tokens(i) for i in rows}
            fits = [i for i in rows if needs[i] <= seq_len + 1]
            if not fits:
                raise ConfigError(f"none of the {len(rows)} {split} pairs fits in architecture.seq_len + 1 = "
                                  f"{seq_len + 1} tokens: raise architecture.seq_len to {min(needs.values()) - 1} for "
                                  f"the shortest, {max(needs.values()) - 1} for every one")
            which = "" if split == "all" else f"{split}: "
            dropped = (f"theseus: {which}dropped {len(rows) - len(fits)} of {len(rows)} preference pairs longer than "
                       f"seq_len + 1 = {seq_len + 1} tokens (the longest needs architecture.seq_len="
                       f"{max(needs.values()) - 1})") if len(fits) < len(rows) else None
            self._state[split, seq_len] = fits, dropped
        fits, dropped = self._state[split, seq_len]
        if say and dropped:
            print(dropped, file=sys.stderr)
            self._state[split, seq_len] = fits, None
        return fits

    def example(self, index: int, seq_len: int) -> dict[str, np.ndarray]:
        """Pair ``index`` as an example (see the module), with the reference's log-probs once scored (else 0)."""
        prompt, *completions = self.pairs[index]
        tokens, completion = np.zeros((2, 2, seq_len + 1), np.int32)
        for row, done in enumerate(completions):
            end = len(prompt) + len(done)
            tokens[row, :end] = np.concatenate([prompt, done])
            completion[row, len(prompt):end] = 1
        logps = self._state.get("logps")
        reference = np.zeros(2, np.float32) if logps is None else logps[index]
        return {"tokens": tokens, "completion": completion, "reference": reference}

    def loader(self, split: str, seq_len: int, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, prefetch: int = 8) -> Loader:
        """Batches of ``split``'s pairs (dicts of ``[batch_size, ...]``), this process's share of each
        global batch, reshuffled each epoch, as ``TokenDataset.loader`` gives (the same state and resume)."""
        self._require_reference()
        windows = PairWindows(self, seq_len, self.fitting(split, seq_len, say=True), batch_size, seed, process_index,
                              process_count)
        return Loader.over(windows, split=split, prefetch=prefetch)

    def validation(self, seq_len: int, batch_size: int, process_index: int = 0, process_count: int = 1,
                   split: str = "val") -> Iterator[tuple[dict[str, np.ndarray], int]]:
        """Every pair of ``split`` (``val``, or ``all``: every row) once: ``(batch, n)`` per global
        batch of ``batch_size`` pairs, ``batch`` this process's share (the last padded with empty
        pairs), ``n`` the pairs of the whole global batch: the mean of the batches' means weighted
        by ``n`` is the mean over the pairs."""
        self._require_reference()
        for batch, rows in in_batches(self.fitting(split, seq_len, say=True), lambda i: self.example(i, seq_len),
                                      self._empty(seq_len), batch_size, process_index, process_count):
            yield batch, len(rows)

    def cached_reference(self, seq_len: int, fingerprint: str) -> bool:
        """Whether the reference of ``fingerprint`` scored these pairs at ``seq_len`` before; if so, its
        log-probs are read back and the pairs scored."""
        path = self._reference_folder(seq_len, fingerprint) / "logps.npy"
        if path.is_file():
            self._state["logps"] = np.load(path, allow_pickle=False)
        return path.is_file()

    def score_reference(self, seq_len: int, fingerprint: str, score: Callable[[dict], np.ndarray], batch_size: int,
                        process_index: int = 0, process_count: int = 1) -> None:
        """Score every pair that fits ``seq_len`` (train and validation) by the reference: ``score``
        takes this process's share of a global batch of ``batch_size`` pairs and gives the whole
        batch's log-probs, float32 [batch_size, 2] (the same on every process). Kept in the cache."""
        rows = sorted(set(self.fitting("train", seq_len)) | set(self.fitting("val", seq_len)))
        logps = np.full((len(self.pairs), 2), np.nan, np.float32)
        with progress("dpo: the reference's log-probs of the pairs", len(rows), "pairs") as advance:
            for batch, held in in_batches(rows, lambda i: self.example(i, seq_len), self._empty(seq_len), batch_size,
                                          process_index, process_count):
                logps[held] = np.asarray(score(batch))[:len(held)]
                advance(len(held))
        folder = self._reference_folder(seq_len, fingerprint)
        with building(folder) as scratch:
            np.save(scratch / "logps.npy", logps)
            meta = {"format": FORMAT, "pairs": self.key, "seq_len": seq_len, "reference": fingerprint}
            (scratch / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        self._state["logps"] = logps

    def _reference_folder(self, seq_len: int, fingerprint: str) -> Path:
        key = json.dumps({"format": FORMAT, "pairs": self.key, "seq_len": seq_len, "reference": fingerprint},
                         sort_keys=True)
        return self.cache_dir / f"reference-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def _require_reference(self) -> None:
        if not self.reference_free and "logps" not in self._state:
            raise RuntimeError("the pairs' reference log-probs are not scored yet: cached_reference or score_reference")

    def _empty(self, seq_len: int) -> dict[str, np.ndarray]:
        return {"tokens": np.zeros((2, seq_len + 1), np.int32), "completion": np.zeros((2, seq_len + 1), np.int32),
                "reference": np.zeros(2, np.float32)}

    def _rows(self, split: str) -> list[int]:
        if split == "all":
            return list(range(len(self.pairs)))
        if split not in self.rows:
            raise ValueError(f"split must be one of train, val, all, got {split!r}")
        return self.rows[split]


class PairWindows(Windows):
    """One pair per window, in an order drawn each epoch (``Loader.over`` reads ``batch``,
    ``stride``, ``identity``)."""

    def __init__(self, preferences: Preferences, seq_len: int, rows: list[int], batch_size: int, seed: int,
                 process_index: int = 0, process_count: int = 1):
        super().__init__([], [[i] for i in rows], seq_len, batch_size, seed, process_index, process_count)
        self.preferences = preferences

    def row(self, window: int) -> dict[str, np.ndarray]:
        return self.preferences.example(self.layout[window][0], self.seq_len)
