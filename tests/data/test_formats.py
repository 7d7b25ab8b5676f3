"""Corpora as researchers hold them (JSONL plain, .gz and .zst, parquet, save_to_disk folders,
text.gz) prepare to exactly each document's tokens, as ``tokenizers`` itself encodes them, plus
one end-of-document token; they mix with another source; bad rows are one line naming the file."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import tokenizers

from data.corpora import DOCS, FORMATS, stream, write_corpus
from theseus.cli.prepare import main
from theseus.config import ConfigError
from theseus.data.dataset import open_dataset
from theseus.data.prepare import prepare
from theseus.data.shards import read_meta
from theseus.data.tokenizer import EOT, HFTokenizer

TEXTS = [row["text"] for row in DOCS]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> str:
    """A byte-level BPE tokenizer.json (with <|endoftext|>), trained here on other text."""
    folder = tmp_path_factory.mktemp("bpe")
    HFTokenizer.train(["the quick brown fox, naïve café: def f(x): return x * 2\n" * 50], 300).save(folder)
    return str(folder / "tokenizer.json")


def expected(tokenizer_json: str, texts: list[str], eos: str = EOT) -> np.ndarray:
    """What tokenizers itself makes of ``texts``: each one's ids, then the ``eos`` token's id."""
    reference = tokenizers.Tokenizer.from_file(tokenizer_json)
    eot = reference.token_to_id(eos)
    return np.array([i for text in texts for i in [*reference.encode(text, add_special_tokens=False).ids, eot]])


@pytest.mark.parametrize("fmt", [*FORMATS, "text.gz"])
def test_each_format_prepares_to_its_tokens_and_one_eot_per_document(tmp_path, config, bpe, fmt):
    if fmt == "text.gz":  # one document per file
        path, source, split = tmp_path / "texts", "text", "train"
        path.mkdir()
        for i, text in enumerate(TEXTS):
            (path / f"{i}.txt.gz").write_bytes(gzip.compress(text.encode()))
    else:
        path, source, split = write_corpus(tmp_path, fmt, DOCS, field="content" if fmt == "parquet" else "text")
    cfg = config(source=source, path=str(path), split=split, tokenizer=bpe,
                 text_field="content" if fmt == "parquet" else "text")
    folder = prepare(cfg)
    np.testing.assert_array_equal(stream(folder), expected(bpe, TEXTS))
    meta = read_meta(folder)
    assert meta.bytes_per_token == sum(len(t.encode()) for t in TEXTS) / len(expected(bpe, TEXTS))
    assert prepare(cfg) == folder  # cached


def test_byte_tokenizer_and_an_init_from_folders_eos(tmp_path, config, bpe):
    path, source, _ = write_corpus(tmp_path, "jsonl.zst", DOCS)
    folder = prepare(config(source=source, path=str(path)))
    assert stream(folder).tolist() == [i for t in TEXTS for i in [*t.encode(), 256]]
    # a Hugging Face folder's tokenizer ends documents with the eos_token its tokenizer_config.json names
    model = tmp_path / "model"
    model.mkdir()
    hf = tokenizers.Tokenizer.from_file(bpe)
    hf.add_special_tokens(["</s>"])
    hf.save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "</s>"}}))
    folder = prepare(config(source=source, path=str(path), tokenizer=str(model / "tokenizer.json")))
    np.testing.assert_array_equal(stream(folder), expected(str(model / "tokenizer.json"), TEXTS, "</s>"))


def test_the_cache_follows_the_files_and_the_text_field(tmp_path, config):
    rows = [{"text": "abc", "title": "T"}]
    path, source, _ = write_corpus(tmp_path, "jsonl", rows)
    first = prepare(config(source=source, path=str(path)))
    titles = prepare(config(source=source, path=str(path), text_field="title"))
    assert titles != first and stream(titles).tolist() == [ord("T"), 256]
    write_corpus(tmp_path, "jsonl", [{"text": "abcd"}])
    again = prepare(config(source=source, path=str(path)))
    assert again != first and stream(again).tolist() == [*b"abcd", 256]


def test_a_record_source_mixes_with_another(tmp_path, config, bpe):
    jsonl, _, _ = write_corpus(tmp_path / "a", "jsonl.gz", DOCS * 20)
    parquet, _, _ = write_corpus(tmp_path / "b", "parquet", DOCS[::-1] * 20, field="body")
    mixture = {"web": {"source": "jsonl", "path": str(jsonl), "weight": 3},
               "books": {"source": "parquet", "path": str(parquet), "weight": 1, "text_field": "body"}}
    mixed = open_dataset(config(tokenizer=bpe, mixture=mixture, val_fraction=0.1))
    np.testing.assert_array_equal(stream(mixed.sources["web"].folder), expected(bpe, TEXTS * 20))
    np.testing.assert_array_equal(stream(mixed.sources["books"].folder), expected(bpe, TEXTS[::-1] * 20))
    assert mixed.weights == {"web": 0.75, "books": 0.25}
    assert next(mixed.loader("train", seq_len=16, batch_size=4, seed=0, prefetch=0)).shape == (4, 17)


def bad(tmp_path, config, fmt, rows, **overrides) -> tuple[str, str]:
    """``(path, message)`` of preparing ``rows`` written as ``fmt``, which must fail writing nothing."""
    path, source, split = write_corpus(tmp_path, fmt, rows)
    with pytest.raises(ConfigError) as caught:
        prepare(config(source=source, path=str(path), split=split, **overrides))
    assert not (tmp_path / "cache").exists()
    return str(path), str(caught.value)


def test_bad_rows_name_the_file_and_what_to_do(tmp_path, config):
    path, message = bad(tmp_path, config, "jsonl.gz", [{"text": "a"}, {"id": 2, "body": "b"}])
    assert message == (f"{path}:2 has no field 'text' (its fields: id, body): "
                       "set data.text_field to the one holding the text")
    path, message = bad(tmp_path, config, "jsonl", [{"text": "a"}, {"text": ["b"]}])
    assert message == (f"{path}:2 field 'text' is a list, not a string: set data.text_field to a text field, "
                       "or fix or drop that row")
    path, message = bad(tmp_path, config, "parquet", [{"text": "a"}, {"text": None}])
    assert message == (f"{path}, row 2, field 'text' is null, not a string: set data.text_field to a text field, "
                       "or fix or drop that row")
    path, message = bad(tmp_path, config, "parquet", [{"text": "a", "id": 1}], text_field="content")
    assert message == (f"{path} has no column 'content' (its columns: text, id): "
                       "set data.text_field to the one holding the text")
    path, message = bad(tmp_path, config, "dataset", [{"text": 1}])
    assert message.startswith(f"{path}/data-00000-of-00001.arrow, row 1, field 'text' is a number, not a string")
    path, message = bad(tmp_path, config, "jsonl", [{"text": "a"}], tokenizer="char")
    assert message.startswith("data.tokenizer=char has no end-of-document token, which ends each row of "
                              "data.source=jsonl: use byte, bpe, or a tokenizer.json")


def test_an_empty_corpus_and_a_foreign_folder_fail_in_one_line(tmp_path, config, capsys):
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(ConfigError, match=r"^data.path=.*blank.jsonl holds no documents \(no rows in 1 file\(s\)\): "):
        prepare(config(source="jsonl", path=str(tmp_path / "blank.jsonl")))
    capsys.readouterr()
    cache = tmp_path / "cache"
    assert main(["data.source=arrow", f"data.path={tmp_path}", f"data.cache_dir={cache}"]) == 2
    assert capsys.readouterr().err == (
        f"theseus: error: {tmp_path} is not a folder written by datasets' save_to_disk (it has no state.json or "
        "dataset_dict.json): point data.path at one, or use data.source=parquet or jsonl for other files\n")
    assert not cache.exists()
