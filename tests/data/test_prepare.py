"""Preparation: exact token streams, a seeded split, a cache keyed by settings, idempotent,
atomic under interruption, and bad input reported with nothing written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from data.corpora import stream
from support import ROOT, run_python
from theseus.config import ConfigError
from theseus.data.cache import building
from theseus.data.corpus_files import corpus_files, stdlib_files
from theseus.data.prepare import prepare, split_blocks
from theseus.data.shards import read_meta

EOT = (256).to_bytes(2, "little")  # the byte tokenizer's end-of-text id, as a uint16


def byte_stream(files) -> bytes:
    """What the byte tokenizer writes: each file's bytes as uint16, then end-of-text."""
    return b"".join(np.frombuffer(f.read_bytes(), np.uint8).astype("<u2").tobytes() + EOT for f in files)


def test_byte_preparation_is_exact(corpus, config, capsys):
    folder = prepare(config(source="text", path=str(corpus)))
    files = corpus_files(config(source="text", path=str(corpus)))
    assert [f.name for f in files] == ["a.txt", "b.md", "c.py"]
    assert stream(folder).tobytes() == byte_stream(files)
    meta = read_meta(folder)
    size = sum(f.stat().st_size for f in files)
    assert (meta.dtype, meta.vocab_size, meta.tokenizer) == ("uint16", 257, "byte")
    assert meta.bytes_per_token == size / (size + 3)
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "train.bin", "val.bin"]
    assert capsys.readouterr().err == ""  # off a terminal, a second's work says nothing (test_chat_corpus.py)


def test_second_call_is_a_no_op(corpus, config, capsys):
    cfg = config(source="text", path=str(corpus), tokenizer="char")
    folder = prepare(cfg)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    capsys.readouterr()
    assert prepare(cfg) == folder
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert capsys.readouterr().err == ""
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_cache_is_keyed_by_tokenizer_settings_and_files(corpus, config):
    base = prepare(config(source="text", path=str(corpus)))
    others = {prepare(config(source="text", path=str(corpus), **change))
              for change in ({"tokenizer": "char"}, {"seed": 1}, {"val_fraction": 0.2}, {"max_files": 2})}
    (corpus / "a.txt").write_text("changed")
    others.add(prepare(config(source="text", path=str(corpus))))
    assert base not in others and len(others) == 5
    assert base.name.startswith("text-byte-")


def test_split_is_fixed_by_seed(corpus, config, tmp_path):
    def val(seed, cache):
        folder = prepare(config(source="text", path=str(corpus), seed=seed, val_fraction=0.1,
                                cache_dir=str(tmp_path / cache)))
        return (folder / "val.bin").read_bytes()

    assert val(0, "one") == val(0, "two")
    assert val(0, "one") != val(1, "one")


def test_split_blocks():
    block, is_val = split_blocks(1_000_000, 0.01, seed=0)
    assert (block, len(is_val), is_val.sum()) == (10_000, 100, 1)
    block, is_val = split_blocks(10_000_000, 0.05, seed=0)
    assert (block, len(is_val), is_val.sum()) == (16_384, 611, 31)
    assert split_blocks(50, 0.5, seed=0)[1].sum() == 25
    assert split_blocks(1000, 0.0, seed=0)[1].sum() == 0
    assert split_blocks(1, 0.5, seed=0)[1].sum() == 0  # never all of it
    np.testing.assert_array_equal(split_blocks(10**6, 0.1, 3)[1], split_blocks(10**6, 0.1, 3)[1])


def test_stdlib_source(config):
    folder = prepare(config(max_files=4))
    assert stream(folder).tobytes() == byte_stream(stdlib_files()[:4])
    assert folder.name.startswith("stdlib-byte-")


SLOW_PREPARE = """
import sys, time
import theseus.data.documents as d
import theseus.data.progress
from theseus.data.config import DataConfig
from theseus.data.prepare import prepare
read = d.read_text
d.read_text = lambda path: (time.sleep(0.1), read(path))[1]  # slow enough to be killed mid-way
d.CHUNK_BYTES = 1  # one file per chunk: a progress line after each
theseus.data.progress.PLAIN_SECONDS = 0.0  # each as soon as it may come
prepare(DataConfig(source="text", path=sys.argv[1], cache_dir=sys.argv[2]))
"""


def test_interrupted_preparation_leaves_nothing_loadable(tmp_path, config):
    corpus = tmp_path / "many"
    corpus.mkdir()
    for i in range(30):
        (corpus / f"{i:02}.txt").write_text(f"file {i}\n" * (i + 1))
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", SLOW_PREPARE, str(corpus), str(cache)], cwd=ROOT, env=env,
                             stderr=subprocess.PIPE, text=True)
    for line in child.stderr:
        if "tokenizing (byte): 10%" in line:
            child.send_signal(signal.SIGKILL)
            break
    assert child.wait(timeout=60) == -signal.SIGKILL
    child.stderr.close()
    left = [p.name for p in cache.iterdir()]
    assert len(left) == 1 and ".tmp-" in left[0]  # a scratch folder, no shard folder

    folder = prepare(config(source="text", path=str(corpus)))
    assert [p.name for p in cache.iterdir()] == [folder.name]  # the scratch folder is gone
    assert stream(folder).tobytes() == byte_stream(sorted(corpus.iterdir()))


def test_a_folder_completed_elsewhere_first_is_kept(tmp_path):
    final = tmp_path / "cache" / "corpus"
    with building(final) as scratch:
        (scratch / "mine.bin").write_text("ours")
        final.mkdir()  # another host finished the same preparation meanwhile
        (final / "theirs.bin").write_text("theirs")
    assert [p.name for p in final.parent.iterdir()] == ["corpus"]
    assert [p.name for p in final.iterdir()] == ["theirs.bin"]


BAD_INPUT = [
    ({"source": "text"}, "data.source=text needs data.path: set data.path to a file, a folder or a glob"),
    ({"source": "text", "path": "{tmp}/nowhere"},
     "data.path={tmp}/nowhere does not exist: set data.path to a file, a folder or a glob"),
    ({"source": "text", "path": "{tmp}/corpus/*.rst"},
     "data.path={tmp}/corpus/*.rst matches no text files: point data.path at a file, a folder or a glob"),
    ({"source": "text", "path": "{tmp}/empty"},
     "the corpus at data.path={tmp}/empty is empty (1 files of 0 bytes): give data.path some text"),
    ({"source": "text", "path": "{tmp}/corpus", "tokenizer": "{tmp}/corpus/a.txt"},
     "{tmp}/corpus/a.txt does not parse as a Hugging Face tokenizer.json (expected value at line 1 column 1): "
     "point data.tokenizer at a file saved by tokenizers.Tokenizer.save"),
    ({"source": "text", "path": "{tmp}/corpus", "tokenizer": "bytes"},
     "tokenizer file bytes does not exist: set data.tokenizer to byte, char, bpe, the path of a tokenizer.json or "
     "of a GGUF file"),
]


@pytest.mark.parametrize("overrides, message", BAD_INPUT)
def test_bad_input_is_one_line_and_writes_nothing(corpus, config, tmp_path, overrides, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "e.txt").touch()
    overrides = {k: v.format(tmp=tmp_path) for k, v in overrides.items()}
    with pytest.raises(ConfigError) as err:
        prepare(config(**overrides))
    assert str(err.value) == message.format(tmp=tmp_path)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("tokenizer", ["byte", "char"])  # fails while tokenizing / while fitting
def test_file_that_is_not_utf8_writes_nothing(corpus, config, tmp_path, tokenizer):
    (corpus / "sub" / "d.bin").write_bytes(b"ok\xff\xfe")
    with pytest.raises(ConfigError) as err:
        prepare(config(source="text", path=str(corpus), tokenizer=tokenizer))
    assert str(err.value) == (f"{corpus}/sub/d.bin is not UTF-8 text (byte 0xff at offset 2): "
                              "convert it to UTF-8 or leave it out of data.path")
    assert not (tmp_path / "cache").exists()


def test_settings_are_checked_where_they_are_made(config):
    with pytest.raises(ConfigError, match=r"^data.val_fraction must be in \(0, 1\), got 1.0: "):
        config(val_fraction=1.0)
    with pytest.raises(ConfigError, match=r"^data.bpe_vocab_size=200 leaves no merges"):
        config(tokenizer="bpe", bpe_vocab_size=200)


@pytest.mark.slow
def test_command_line(corpus, tmp_path):
    args = ["-m", "theseus.data.prepare", "data.source=text", f"data.path={corpus}", f"data.cache_dir={tmp_path / 'c'}"]
    first, second = run_python(*args, timeout=120), run_python(*args, timeout=120)
    assert first.returncode == 0, first.stderr
    assert first.stderr == second.stderr == "" and second.stdout == first.stdout  # a second's work: its result alone
    folder = read_meta(next((tmp_path / "c").iterdir()))
    assert first.stdout.endswith(f": {folder.counts['train']:,} train + {folder.counts['val']:,} val tokens, "
                                 "byte vocabulary of 257\n")
    bad = run_python("-m", "theseus.data.prepare", "data.source=text", f"data.path={tmp_path}/nowhere", timeout=120)
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == (f"theseus: error: data.path={tmp_path}/nowhere does not exist: "
                          "set data.path to a file, a folder or a glob\n")
