"""open_dataset: prepares on first use, opens shard folders, and reports shards that disagree."""

from __future__ import annotations

import json

import numpy as np
import pytest

from theseus.config import ConfigError
from theseus.data.corpus_files import corpus_files
from theseus.data.dataset import open_dataset, planned_vocab_size
from theseus.data.tokenizer import HFTokenizer

TEXT = "".join(f"word{i} " * (i % 7 + 1) for i in range(300))  # enough distinct pairs for 270 tokens


def write_shards(folder, train, val, **meta):
    """uint16 shards, with a meta.json that ``meta`` may contradict."""
    folder.mkdir(parents=True, exist_ok=True)
    np.asarray(train, "<u2").tofile(folder / "train.bin")
    np.asarray(val, "<u2").tofile(folder / "val.bin")
    counts = {"train": len(train), "val": len(val)}
    meta = {"dtype": "uint16", "vocab_size": 257, "tokenizer": "byte", "counts": counts, **meta}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_prepares_on_first_use_and_decodes(corpus, config):
    cfg = config(source="text", path=str(corpus), tokenizer="char", val_fraction=0.1)
    ds = open_dataset(cfg)
    text = "".join(path.read_text() for path in corpus_files(cfg))
    assert ds.vocab_size == ds.tokenizer.vocab_size == len(set(text))
    assert ds.n_tokens("train") + ds.n_tokens("val") == len(text)
    assert ds.bytes_per_token == len(text.encode()) / len(text)
    batch = next(ds.loader("train", seq_len=8, batch_size=3, seed=0))
    assert batch.shape == (3, 9) and ds.tokenizer.decode(batch[0]) in text


def test_prepared_folder_opens_as_shards(corpus, config):
    prepared = open_dataset(config(source="text", path=str(corpus), tokenizer="bpe", bpe_vocab_size=300))
    shards = open_dataset(config(source="shards", path=str(prepared.folder), tokenizer="bpe"))
    assert shards.vocab_size == 300 and shards.tokenizer.encode("def f") == prepared.tokenizer.encode("def f")
    np.testing.assert_array_equal(shards.tokens["train"], prepared.tokens["train"])


def test_a_planned_run_knows_its_vocabulary_without_its_corpus(tmp_path, corpus, config):
    HFTokenizer.train([TEXT], vocab_size=270).save(tmp_path)
    for tokenizer, extra in (("byte", {}), ("bpe", {"bpe_vocab_size": 300}), (str(tmp_path / "tokenizer.json"), {})):
        prepared = open_dataset(config(source="text", path=str(corpus), tokenizer=tokenizer, **extra))
        missing = config(source="text", path=str(tmp_path / "on_the_cluster.txt"), tokenizer=tokenizer, **extra)
        assert planned_vocab_size(missing) == prepared.vocab_size
    char = config(source="text", path=str(tmp_path / "on_the_cluster.txt"), tokenizer="char")
    assert planned_vocab_size(char, declared=512) == 512
    with pytest.raises(ConfigError, match=r"data.tokenizer=char is fitted to the corpus, .* set architecture.vocab_size"):
        planned_vocab_size(char)


def test_foreign_shards_with_a_tokenizer_file(tmp_path, config):
    tokenizer = HFTokenizer.train(["hello world"] * 10, vocab_size=300)
    tokenizer.save(tmp_path)
    vocab = tokenizer.vocab_size  # below 300: this corpus runs out of merges
    folder = write_shards(tmp_path / "gpt", np.arange(100) % vocab, [1, 2, 3], vocab_size=vocab, tokenizer="gpt2")
    ds = open_dataset(config(source="shards", path=str(folder), tokenizer=str(tmp_path / "tokenizer.json")))
    assert (ds.vocab_size, ds.n_tokens("train"), ds.n_tokens("val"), ds.bytes_per_token) == (vocab, 100, 3, None)
    assert ds.tokenizer.decode(ds.tokenizer.encode("hello")) == "hello"
    with pytest.raises(ConfigError) as err:
        open_dataset(config(source="shards", path=str(folder)))
    assert str(err.value) == (f"data.tokenizer=byte but {folder}/meta.json says the shards were tokenized with 'gpt2': "
                              "set data.tokenizer to the path of their tokenizer.json")


def test_too_short_split_for_a_window(tmp_path, config):
    ds = open_dataset(config(source="shards", path=str(write_shards(tmp_path / "s", range(100), range(5)))))
    with pytest.raises(ConfigError) as err:
        ds.loader("val", seq_len=8, batch_size=2, seed=0)
    assert str(err.value) == (f"the val split of {tmp_path}/s holds 5 tokens, fewer than seq_len + 1 = 9: "
                              "lower architecture.seq_len or give data.val_fraction more")
    with pytest.raises(ValueError, match="split must be one of train, val, got 'test'"):
        ds.n_tokens("test")


BAD_SHARDS = [
    ({"dtype": "uint32"}, "{s}/train.bin is 20 bytes, not 10 uint32 tokens as {s}/meta.json says: "
                          "fix its dtype and counts, or re-tokenize"),
    ({"counts": {"train": 11, "val": 3}}, "{s}/train.bin is 20 bytes, not 11 uint16 tokens as {s}/meta.json says: "
                                          "fix its dtype and counts, or re-tokenize"),
    ({"dtype": "int8"}, "{s}/meta.json: dtype must be uint16 or uint32, got 'int8': fix meta.json"),
    ({"vocab_size": 70000}, "{s}/meta.json: vocab_size 70000 does not fit dtype uint16: "
                            "fix meta.json or write the shards as uint32"),
    ({"vocab_size": 5, "tokenizer": "x"}, "{s}/train.bin holds token 9, beyond vocab_size 5 of {s}/meta.json: "
                                          "fix its vocab_size or dtype"),
    ({"counts": {"train": 10}}, "{s}/meta.json: counts must give the tokens of train and val, got {{'train': 10}}: "
                                "fix meta.json"),
    ({"tokenizer": "char"}, "data.tokenizer=byte but {s}/meta.json says the shards were tokenized with 'char': "
                            "set data.tokenizer to char"),
    ({"bytes_per_token": "1.5"}, "{s}/meta.json: bytes_per_token must be a positive number (UTF-8 bytes of text per "
                                 "token) or null, got '1.5': fix meta.json"),  # before: a traceback at an evaluation
    ({"bytes_per_token": 0}, "{s}/meta.json: bytes_per_token must be a positive number (UTF-8 bytes of text per "
                             "token) or null, got 0: fix meta.json"),
]


@pytest.mark.parametrize("meta, message", BAD_SHARDS)
def test_shards_that_disagree_with_their_metadata(tmp_path, config, meta, message):
    folder = write_shards(tmp_path / "s", range(10), [1, 2, 3], **meta)
    with pytest.raises(ConfigError) as err:
        open_dataset(config(source="shards", path=str(folder)))
    assert str(err.value) == message.format(s=folder)
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_shard_folder_problems(tmp_path, config):
    folder = write_shards(tmp_path / "s", range(10), [1])
    (folder / "val.bin").unlink()
    cases = {
        str(folder): f"{folder}/val.bin is missing: give the shard folder both train.bin and val.bin",
        str(tmp_path / "none"): f"data.path={tmp_path}/none is not a folder: set it to a folder of train.bin, "
                                "val.bin and meta.json",
        str(tmp_path): f"{tmp_path}/meta.json is missing: a shard folder holds train.bin, val.bin and meta.json "
                       "(python -m theseus.data.prepare writes one)",
    }
    for path, message in cases.items():
        with pytest.raises(ConfigError) as err:
            open_dataset(config(source="shards", path=path))
        assert str(err.value) == message
    (folder / "meta.json").write_text("{oops")
    with pytest.raises(ConfigError, match=rf"^{folder}/meta.json does not parse as JSON \(.*\): fix or rewrite it$"):
        open_dataset(config(source="shards", path=str(folder)))


def test_tokenizer_file_of_another_vocabulary(tmp_path, config):
    HFTokenizer.train([TEXT], vocab_size=270).save(tmp_path)
    folder = write_shards(tmp_path / "s", range(10), [1])
    with pytest.raises(ConfigError) as err:
        open_dataset(config(source="shards", path=str(folder), tokenizer=str(tmp_path / "tokenizer.json")))
    assert str(err.value) == (f"{tmp_path}/tokenizer.json has 270 tokens but {folder}/meta.json says vocab_size 257: "
                              "use the tokenizer the shards were made with")
