"""A chat corpus is rendered once: a second start reads the cache (the split, packing and window
length drawn again from it), a new template, train_on, tokenizer or file renders again; char and
bpe vocabularies come back from the cache as they were fitted."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from theseus.config import ConfigError
from theseus.data.chat import ChatTemplate, tokenize
from theseus.data.chat_corpus import prepare_chats
from theseus.data.config import DataConfig

ROWS = [{"messages": [{"role": "user", "content": f"What is {i} squared?"},
                      {"role": "assistant", "content": f"{i * i}, naïvely ✓."}]} for i in range(20)]


@pytest.fixture
def chats(tmp_path) -> DataConfig:
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return DataConfig(source="jsonl", path=str(path), cache_dir=str(tmp_path / "cache"), val_fraction=0.25)


def not_rendered(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("rendered again")

    monkeypatch.setattr(ChatTemplate, "render", refuse)


def same(a, b) -> bool:
    return all(x.tolist() == y.tolist() for pair_a, pair_b in zip(a, b) for x, y in zip(pair_a, pair_b))



def test_rendering_shows_its_progress_and_reading_the_cache_does_not(chats, capfd, monkeypatch, tmp_path):
    """Off a terminal, work of a few seconds says nothing; longer work (here: lines as often as
    they may come) a line at the first conversation and every 10% after, rendered, then tokenized."""
    import theseus.data.progress

    prepare_chats(chats)
    assert capfd.readouterr().err == ""
    for made in (tmp_path / "cache").iterdir():
        shutil.rmtree(made)
    monkeypatch.setattr(theseus.data.progress, "PLAIN_SECONDS", 0.0)
    prepare_chats(chats)
    lines = capfd.readouterr().err.splitlines()
    where = f"data.path={chats.path}"
    percents = [5, *range(10, 101, 10)]  # 1 of 20, then each tenth
    assert [line.rsplit(" (", 1)[0] for line in lines] == [
        *(f"theseus: sft: rendering the conversations of {where}: {p}%" for p in percents),
        *(f"theseus: sft: tokenizing them (byte): {p}%" for p in percents)]
    assert lines[-1].startswith("theseus: sft: tokenizing them (byte): 100% (20/20 conversations, ")
    prepare_chats(chats)
    assert capfd.readouterr().err == ""

def test_a_second_start_reads_the_cache(chats, monkeypatch, tmp_path):
    first = prepare_chats(chats)
    [folder] = (tmp_path / "cache").iterdir()
    assert folder.name.startswith("chats-jsonl-byte-")
    with monkeypatch.context() as patch:
        not_rendered(patch)
        again = prepare_chats(chats)
        assert again.rows == first.rows and all(same(again.splits[s], first.splits[s]) for s in ("train", "val"))
        other = prepare_chats(dataclasses.replace(chats, val_fraction=0.5, seed=3, packing=False))  # drawn again
        assert other.n_conversations("val") == 10 and other.rows != first.rows and not other.packing
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]

    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {% if m['role'] == 'assistant' %}{% generation %}"
                        "{{ m['content'] }}<|endoftext|>{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}\n"
                        "{% endfor %}")
    changed = [prepare_chats(dataclasses.replace(chats, **change))
               for change in ({"chat_template": str(template)}, {"train_on": "all"}, {"tokenizer": "char"})]
    assert changed[0].splits["val"][0][0].tolist() != first.splits["val"][0][0].tolist()
    with open(chats.path, "a") as f:
        f.write(json.dumps(ROWS[0]) + "\n")
    assert prepare_chats(chats).n_conversations("train") == 16
    assert len(list((tmp_path / "cache").iterdir())) == 5


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_fitted_vocabulary_comes_back_from_the_cache(chats, monkeypatch, kind):
    cfg = dataclasses.replace(chats, tokenizer=kind, bpe_vocab_size=300)
    first = prepare_chats(cfg)
    not_rendered(monkeypatch)
    again = prepare_chats(cfg)
    assert (again.tokenizer.kind, again.tokenizer.vocab_size, again.tokenizer.eot) == \
        (kind, first.tokenizer.vocab_size, first.tokenizer.eot) and first.tokenizer.eot is not None
    text = "<|user|>\nWhat is 3 squared?<|endoftext|>\n"
    assert tokenize(again.tokenizer, text)[0].tolist() == tokenize(first.tokenizer, text)[0].tolist()
    assert same(again.splits["train"], first.splits["train"])
    ids, mask = again.splits["train"][0]
    assert again.tokenizer.decode(ids[mask].tolist()).endswith(", naïvely ✓.<|endoftext|>")


def test_a_bad_row_writes_nothing(chats, tmp_path):
    with open(chats.path, "a") as f:
        f.write(json.dumps({"text": "not a chat"}) + "\n")
    with pytest.raises(ConfigError, match="row 21 of data.path=.* has no field 'messages'"):
        prepare_chats(chats)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
