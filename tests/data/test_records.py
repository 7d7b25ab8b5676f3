"""Records: every format's rows read back exactly, paths resolved as files, folders and globs,
and bad input reported in one line naming the file."""

from __future__ import annotations

import gzip

import pytest

from data.corpora import DOCS, FORMATS, write_corpus
from theseus.config import ConfigError
from theseus.data.records import data_files, iter_records


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_back_its_rows(tmp_path, fmt):
    path, source, split = write_corpus(tmp_path, fmt, DOCS)
    assert list(iter_records([path], source, split)) == DOCS


def test_folders_and_globs(tmp_path):
    write_corpus(tmp_path / "shards" / "a", "jsonl.gz", DOCS[:2])
    write_corpus(tmp_path / "shards" / "b", "jsonl", DOCS[2:])
    (tmp_path / "shards" / "README.md").write_text("not data")
    (tmp_path / "shards" / "b" / "dataset_info.json").write_text("{\n}")
    assert list(iter_records([tmp_path / "shards"], "jsonl")) == DOCS
    assert data_files(str(tmp_path / "shards" / "*" / "corpus.*"), "jsonl") == [
        tmp_path / "shards" / "a" / "corpus.jsonl.gz", tmp_path / "shards" / "b" / "corpus.jsonl"]
    write_corpus(tmp_path / "pq", "parquet", DOCS)
    (tmp_path / "pq" / "notes.txt").write_text("not data")
    assert list(iter_records([tmp_path / "pq"], "parquet")) == DOCS


def error(paths, source, split="train") -> str:
    with pytest.raises(ConfigError) as caught:
        list(iter_records(paths, source, split))
    return str(caught.value)


def test_bad_input_names_the_file(tmp_path):
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"text": "a"}\n\n{"text": oops}\n'))
    assert error([bad], "jsonl") == (f"{bad}:3 is not JSON (Expecting value): each line of a JSONL file holds one "
                                     "JSON object; fix or drop that line")
    bad.write_bytes(gzip.compress(b'{"text": "a"}\n["a list"]\n'))
    assert error([bad], "jsonl") == (f"{bad}:2 is a JSON list, not an object: each line of a JSONL file holds "
                                     'one object such as {"text": "..."}')
    bad.write_bytes(gzip.compress(b'{"text": "a"}\n' * 100)[:-20])
    assert error([bad], "jsonl").startswith(f"{bad} cannot be read (")
    path, _, _ = write_corpus(tmp_path, "datasetdict", DOCS)
    assert error([path], "arrow", "validation") == (f"{path} is a DatasetDict of splits train, test, not "
                                                    "'validation': set data.split to one of them")
    assert error([tmp_path], "arrow") == (
        f"{tmp_path} is not a folder written by datasets' save_to_disk (it has no state.json or dataset_dict.json): "
        "point data.path at one, or use data.source=parquet or jsonl for other files")
    assert error([bad], "parquet").startswith(f"{bad} is not a parquet file (")
    assert error([tmp_path / "nothing"], "jsonl") == (f"data.path={tmp_path / 'nothing'} does not exist: "
                                                      "set data.path to a file, a folder or a glob")
