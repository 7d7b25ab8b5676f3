"""Every tokenizer round-trips; byte and char are exact; bad ids and files are reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from theseus.config import ConfigError
from theseus.data.dataset import open_dataset
from theseus.data.tokenizer import ByteTokenizer, CharTokenizer, HFTokenizer, export_tokenizer, load_tokenizer

TEXT = "def f(x):\n\treturn x  # naïve café, 日本語 ✓\n\n  spaces   end "
CORPUS = [TEXT, "class A:\n    pass\n" * 50, "hello world " * 30]


def tokenizers(tmp_path: Path):
    bpe = HFTokenizer.train(CORPUS, vocab_size=300)
    bpe.save(tmp_path)
    return {"byte": ByteTokenizer(), "char": CharTokenizer.fit(CORPUS), "bpe": bpe,
            "json": HFTokenizer.from_file(tmp_path / "tokenizer.json"),
            "char_eot": CharTokenizer.fit(CORPUS, eot=True)}  # a chat corpus's: <|endoftext|> ends each turn


@pytest.mark.parametrize("kind", ["byte", "char", "bpe", "json", "char_eot"])
def test_round_trip(tmp_path, kind):
    tokenizer = tokenizers(tmp_path)[kind]
    ids = tokenizer.encode(TEXT)
    assert all(isinstance(i, int) and 0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == TEXT
    assert [a.tolist() for a in tokenizer.encode_batch(CORPUS)] == [tokenizer.encode(t) for t in CORPUS]


@pytest.mark.parametrize("kind", ["byte", "bpe", "json"])
def test_printable_text_escapes_what_a_terminal_acts_on(tmp_path, kind):
    tokenizer = tokenizers(tmp_path)[kind]
    assert tokenizer.printable(tokenizer.encode(TEXT)) == TEXT  # tab, newline, any character as they are
    assert tokenizer.printable(tokenizer.encode("a\x1b[31mb\x00\r\x7f\x9b")) == "a\\x1b[31mb\\x00\\x0d\\x7f\\x9b"


@pytest.mark.parametrize("kind", ["byte", "char", "bpe", "char_eot"])
def test_saved_tokenizer_encodes_alike(tmp_path, kind):
    tokenizer = tokenizers(tmp_path)[kind]
    folder = tmp_path / "saved"
    folder.mkdir()
    tokenizer.save(folder)
    loaded = load_tokenizer(folder, tokenizer.kind)
    assert (loaded.vocab_size, loaded.eot) == (tokenizer.vocab_size, tokenizer.eot)
    assert loaded.encode(TEXT) == tokenizer.encode(TEXT)


def test_byte_ids_and_end_of_text():
    tokenizer = ByteTokenizer()
    assert (tokenizer.vocab_size, tokenizer.eot) == (257, 256)
    assert tokenizer.encode("aé") == [97, 0xC3, 0xA9]
    assert tokenizer.decode([104, 105, 256, 33, 256]) == "hi<|endoftext|>!<|endoftext|>"


def test_bpe_vocabulary_and_end_of_text(tmp_path):
    bpe = tokenizers(tmp_path)["bpe"]
    assert bpe.vocab_size == 300
    assert bpe.decode([bpe.eot]) == "<|endoftext|>"


def test_char_vocabulary_is_the_corpus_characters():
    tokenizer = CharTokenizer.fit(["ba", "ac"])
    assert (tokenizer.symbols, tokenizer.vocab_size, tokenizer.eot) == ("abc", 3, None)
    assert tokenizer.encode("cab") == [2, 0, 1]
    with pytest.raises(ValueError, match=r"^character 'z' is not in the char vocabulary \(built from the corpus\)$"):
        tokenizer.encode("abz")


def test_char_end_of_text_follows_the_characters():
    tokenizer = CharTokenizer.fit(["ba", "ac"], eot=True)
    assert (tokenizer.symbols, tokenizer.vocab_size, tokenizer.eot) == ("abc", 4, 3)
    assert tokenizer.decode([2, 3, 0, 3]) == "c<|endoftext|>a<|endoftext|>"
    assert tokenizer.as_hf().encode("c<|endoftext|>a", add_special_tokens=False).ids == [2, 3, 0]


def test_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(ValueError, match=r"^token id 257 is outside the vocabulary \(0..256\)$"):
        ByteTokenizer().decode([1, 257])
    with pytest.raises(ValueError, match=r"^token id -1 is outside the vocabulary \(0..2\)$"):
        CharTokenizer("abc").decode([-1])


def test_tokenizer_file_that_does_not_parse(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": ')
    with pytest.raises(ConfigError) as err:
        HFTokenizer.from_file(bad)
    message = str(err.value)
    assert message.startswith(f"{bad} does not parse as a Hugging Face tokenizer.json (")
    assert message.endswith("): point data.tokenizer at a file saved by tokenizers.Tokenizer.save")
    assert "\n" not in message


@pytest.mark.parametrize("model", ["WordLevel", "WordPiece"])
def test_a_word_vocabulary_without_its_unknown_token_is_refused_when_read(tmp_path, model):
    """tokenizers itself raises only when a word outside the vocabulary comes (mid-corpus, a traceback
    before); with its unk_token in the vocabulary the file reads and encodes an unknown word as it."""
    import tokenizers as hf

    def write(vocab: list[str], **unk) -> Path:
        tokenizer = hf.Tokenizer(getattr(hf.models, model)({w: i for i, w in enumerate(vocab)}, **unk))
        tokenizer.pre_tokenizer = hf.pre_tokenizers.Whitespace()
        tokenizer.save(str(tmp_path / "tokenizer.json"))
        return tmp_path / "tokenizer.json"

    path = write(["the", "a", "of"])
    unk = getattr(hf.models, model)().unk_token  # the model's default: <unk> (WordLevel), [UNK] (WordPiece)
    with pytest.raises(ConfigError) as err:
        HFTokenizer.from_file(path)
    assert str(err.value) == (f"{path}: its {model} model's unk_token {unk!r} is not in its vocabulary, so a word "
                              f"outside the vocabulary cannot be encoded: add {unk!r} to model.vocab (or set "
                              f"model.unk_token to a token of it), or give another tokenizer")
    path = write(["the", "a", "of", "<u>"], unk_token="<u>")
    assert HFTokenizer.from_file(path).encode("the cat") == [0, 3]


def test_missing_tokenizer_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^tokenizer file .*nope.json does not exist: set data.tokenizer to "
                                          r"byte, char, bpe, the path of a tokenizer.json or of a GGUF file$"):
        HFTokenizer.from_file(tmp_path / "nope.json")


def test_char_on_tinyshakespeare(shakespeare, config):
    ds = open_dataset(config(source="text", path=str(shakespeare), tokenizer="char"))
    assert ds.vocab_size == 65
    assert ds.n_tokens("train") + ds.n_tokens("val") == 1_115_394
    text = shakespeare.read_text(encoding="utf-8")
    assert ds.tokenizer.decode(ds.tokenizer.encode(text)) == text


@pytest.mark.parametrize("kind", ["byte", "char", "bpe", "char_eot"])
def test_exported_tokenizer_json_is_theseus_in_transformers(tmp_path, kind):
    """transformers' AutoTokenizer reads the export and encodes and decodes every text as theseus does."""
    transformers = pytest.importorskip("transformers")
    tokenizer = tokenizers(tmp_path)[kind]
    folder = tmp_path / "hf"
    folder.mkdir()
    export_tokenizer(tokenizer, folder)
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    assert len(hf) == tokenizer.vocab_size and hf.eos_token_id == tokenizer.eot and hf.bos_token_id is None
    for text in [TEXT, *CORPUS, "", " \n"] + (["😀 \r\n"] if not kind.startswith("char") else []):
        ids = tokenizer.encode(text)
        assert hf.encode(text) == ids  # transformers' default adds special tokens: these add none
        assert hf.decode(ids) == tokenizer.decode(ids) == text
    if tokenizer.eot is not None:  # documents joined by the end-of-text token decode alike
        joined = tokenizer.encode(TEXT) + [tokenizer.eot] + tokenizer.encode(CORPUS[1])
        assert hf.decode(joined) == tokenizer.decode(joined)
    if kind == "byte":  # every byte, including those that are not UTF-8 on their own
        assert hf.decode([0xC3]) == tokenizer.decode([0xC3]) == "\ufffd"


def test_a_tokenizer_that_adds_bos_says_so(tmp_path):
    """A Llama-style tokenizer.json (a template adding <s>) encodes with it when asked, and its
    export tells transformers the same."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import processors

    hf = HFTokenizer.train(CORPUS, vocab_size=300).as_hf()
    hf.add_special_tokens(["<s>"])
    bos = hf.token_to_id("<s>")
    hf.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    hf.save(str(tmp_path / "tokenizer.json"))
    tokenizer = HFTokenizer.from_file(tmp_path / "tokenizer.json")
    plain = tokenizer.encode(TEXT)
    assert tokenizer.encode(TEXT, special=True) == [bos, *plain] and tokenizer.prefix_token == bos
    assert ByteTokenizer().prefix_token == 256 and CharTokenizer("ab").prefix_token is None
    folder = tmp_path / "hf"
    folder.mkdir()
    export_tokenizer(tokenizer, folder)
    loaded = transformers.AutoTokenizer.from_pretrained(folder)
    assert loaded.bos_token_id == bos and loaded.encode(TEXT) == [bos, *plain]


def test_a_tokenizer_file_is_read_again_only_when_it_or_its_config_changes(tmp_path):
    """A command asks for its tokenizer several times (its size, then the tokenizer): one read
    while the files stay as they are; another tokenizer, or another end-of-text token, once they change."""
    HFTokenizer.train(CORPUS, vocab_size=300).save(tmp_path)
    path = tmp_path / "tokenizer.json"
    first = HFTokenizer.from_file(path)
    assert HFTokenizer.from_file(path) is first and HFTokenizer.from_file(Path(str(path))) is first
    HFTokenizer.train(CORPUS, vocab_size=280).save(tmp_path)
    assert HFTokenizer.from_file(path).vocab_size == 280
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "a"}')
    assert HFTokenizer.from_file(path).eot == HFTokenizer.from_file(path).as_hf().token_to_id("a") != first.eot
