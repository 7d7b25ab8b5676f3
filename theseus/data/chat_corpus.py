"""A chat corpus prepared once: its conversations rendered by the chat template, tokenized (by a
char or bpe vocabulary fitted to the rendered text first, <|endoftext|> ending each turn) and
masked, then kept in the cache as text corpora are, so a second start reads them back.

    conversations = prepare_chats(data)   # Conversations: rendered on the first call, read after

The cache folder (``data.cache_dir/chats-SOURCE-TOKENIZER-DIGEST``, built under a temporary
name and renamed) holds every conversation in row order (``ids.npy``, ``mask.npy``,
``lengths.npy``), the fitted tokenizer and ``meta.json``. It is keyed by what the encoding depends
on: the files (path, size, mtime), the tokenizer (a tokenizer.json's content and its
tokenizer_config.json's), the template's text and special tokens, ``data.chat_field``,
``data.train_on``, the source's ``data.split`` and ``data.max_files``. The split
(``data.val_fraction``, ``data.seed``) and the windows (``data.packing``,
``architecture.seq_len``) are drawn from the conversations at each start, in milliseconds, so
changing them re-renders nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from theseus.data.cache import building, cache_folder, settings
from theseus.data.chat import ChatTemplate, encode_rendered
from theseus.data.config import DataConfig
from theseus.data.conversations import Conversations, check_rows, render_rows
from theseus.data.corpus_files import rows_files
from theseus.data.docstring_chats import stdlib_chats
from theseus.data.progress import progress
from theseus.data.records import iter_records
from theseus.data.tokenizer import EOT, NAMES, ByteTokenizer, CharTokenizer, HFTokenizer, Tokenizer, load_tokenizer

CHAT_SOURCES = ("stdlib", "jsonl", "parquet", "arrow")
FORMAT = 1  # bump when the files of a prepared chat corpus or the rendering change
META = "meta.json"
NOT_KEYS = ("val_fraction", "seed", "text_field")  # drawn after reading (the split), or a text corpus's


def prepare_chats(data: DataConfig) -> Conversations:
    """``data``'s conversations, encoded and split: read from the cache when a start with the same
    settings prepared them, else rendered, tokenized and written there. ConfigError (nothing
    written) for a source that holds no conversations, a bad row, a template that fails."""
    files = chat_files(data)
    template = ChatTemplate.find(data.tokenizer, data.chat_template)
    given = None if data.tokenizer in NAMES else HFTokenizer.from_file(data.tokenizer)
    folder = chats_folder(data, files, template)
    where = "the standard library" if data.source == "stdlib" else f"data.path={data.path}"
    if (folder / META).is_file():
        tokenizer, encoded = read_chats(folder, given)
        return Conversations.split(encoded, tokenizer, val_fraction=data.val_fraction, seed=data.seed,
                                   packing=data.packing, where=where)
    rows = list(chat_rows(data, files))
    check_rows(rows, data.chat_field, data.train_on, where)  # before anything is rendered
    rendered, encoded = [], []
    with progress(f"sft: rendering the conversations of {where}", len(rows), "conversations") as advance:
        for conversation in render_rows(rows, template, data.chat_field, where):
            rendered.append(conversation)
            advance(1)
    tokenizer = given or chat_tokenizer(data, [text for text, _ in rendered], template)
    with progress(f"sft: tokenizing them ({tokenizer.kind})", len(rows), "conversations") as advance:
        for text, spans in rendered:
            encoded.append(encode_rendered(text, spans, tokenizer, data.train_on))
            advance(1)
    conversations = Conversations.split(encoded, tokenizer, val_fraction=data.val_fraction, seed=data.seed,
                                        packing=data.packing, where=where)  # ConfigError before anything is written
    with building(folder) as scratch:
        write_chats(scratch, tokenizer, encoded)
    return conversations


def chats_folder(data: DataConfig, files: list[Path], template: ChatTemplate) -> Path:
    """The cache folder of ``data``'s conversations rendered by ``template`` (see the module)."""
    return rendered_folder(data, files, template, "chats", chat_format=FORMAT, chat_field=data.chat_field,
                           train_on=data.train_on)


def rendered_folder(data: DataConfig, files: list[Path], template: ChatTemplate | None, prefix: str,
                    **recorded) -> Path:
    """``data.cache_dir/PREFIX-SOURCE-TOKENIZER-DIGEST``: the cache folder of rows of ``data``'s
    files rendered by ``template`` (None: none found) and tokenized, keyed by the files, the
    tokenizer, the template's text and special tokens and what ``recorded`` adds (the split
    and the windows are drawn after reading: not keys)."""
    recorded = {**{key: value for key, value in settings(data, files).items() if key not in NOT_KEYS}, **recorded}
    shown = template and json.dumps({"source": template.source, "special": dict(template.special)}, sort_keys=True)
    recorded["template"] = shown and hashlib.sha256(shown.encode()).hexdigest()
    folder = cache_folder(data, recorded)
    return folder.with_name(f"{prefix}-{folder.name}")


def chat_files(data: DataConfig) -> list[Path]:
    """The files ``data``'s conversations come from (``corpus_files``); ConfigError for a source
    that is not a chat source, or a mixture."""
    return rows_files(data, "sft", "conversations", CHAT_SOURCES,
                      "jsonl, parquet or arrow (rows with a list of messages), or stdlib (docstring questions)")


def chat_rows(data: DataConfig, files: list[Path]) -> Iterator[dict]:
    """The rows of ``data``'s source: the standard library's docstring chats (of its first
    ``data.max_files`` files), or the records of ``files`` (jsonl, parquet or arrow)."""
    if data.source == "stdlib":
        return stdlib_chats(data.max_files)
    return iter_records(files, data.source, data.split)


def chat_tokenizer(data: DataConfig, texts: list[str], template: ChatTemplate) -> Tokenizer:
    """``data.tokenizer`` of theseus's own kinds for conversations: byte, or char or bpe fitted to
    their rendered ``texts`` and the template's generation prompt, <|endoftext|> a token of its own."""
    if data.tokenizer == "byte":
        return ByteTokenizer()
    prompt, _ = template.render([], add_generation_prompt=True)
    texts = [*texts, prompt]
    if data.tokenizer == "char":
        return CharTokenizer.fit((text.replace(EOT, "") for text in texts), eot=True)
    return HFTokenizer.train(texts, data.bpe_vocab_size)


def write_chats(folder: Path, tokenizer: Tokenizer, encoded: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Every conversation's ids and mask, back to back, their lengths, the tokenizer and ``META``."""
    lengths = np.asarray([len(ids) for ids, _ in encoded], np.int64)
    np.save(folder / "ids.npy", np.concatenate([ids for ids, _ in encoded]).astype(np.int32))
    np.save(folder / "mask.npy", np.concatenate([mask for _, mask in encoded]))
    np.save(folder / "lengths.npy", lengths)
    tokenizer.save(folder)
    meta = {"format": FORMAT, "tokenizer": tokenizer.kind, "conversations": len(encoded), "tokens": int(lengths.sum())}
    (folder / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def read_chats(folder: Path, given: Tokenizer | None) -> tuple[Tokenizer, list[tuple[np.ndarray, np.ndarray]]]:
    """What ``write_chats`` wrote: the tokenizer (``given``: a tokenizer.json's, as the key read it)
    and the conversations, in row order."""
    kind = json.loads((folder / META).read_text(encoding="utf-8"))["tokenizer"]
    tokenizer = given or load_tokenizer(folder, kind)
    bounds = np.cumsum(np.load(folder / "lengths.npy", allow_pickle=False))[:-1]
    ids, mask = (np.split(np.load(folder / name, allow_pickle=False), bounds) for name in ("ids.npy", "mask.npy"))
    return tokenizer, list(zip(ids, mask))
