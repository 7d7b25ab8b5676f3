"""GGUF files of every family theseus imports (Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma 2 and 3)
read as transformers' own GGUF loader (``from_pretrained(folder, gguf_file=...)``) reads them: the
config, every tensor of every quantisation, the logits, the tokenizer's ids and special tokens
(byte-level BPE, Llama's, Gemma's and Phi-3's SentencePiece), the chat template. What that loader
does not read (Llama 3.1's RoPE divisors, Gemma's soft-caps, query scale and local RoPE base) is
read as llama.cpp reads it: the logits are the original model's. Files that are not GGUF, or hold
what theseus does not compute, are refused in one line."""

from __future__ import annotations

import copy
import shutil

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from interop.gguf_files import (CHATML, EVERY_KIND, FAMILIES, ORIGINALS, byte_level_vocabulary, family_vocabulary,
                                gemma_vocabulary, llama_config, phi3_vocabulary, random_model, sentencepiece_vocabulary,
                                transformers_tokenizer, write_gguf)
from interop.hf_models import CORPUS, hf_logits, hf_model, target_of, theseus_model, torch, transformers

from theseus.cli.conversation import Conversation
from theseus.cli.export import export
from theseus.config import ConfigError
from theseus.data.chat import ChatTemplate
from theseus.data.config import DataConfig
from theseus.data.dataset import open_dataset
from theseus.data.gguf_file import open_gguf
from theseus.data.gguf_tokenizer import SPLITS, _implied_merges
from theseus.data.tokenizer import HFTokenizer, export_tokenizer
from theseus.interop.gguf import Tensors, config
from theseus.interop.hf_config import FULL, SLIDING, arch_of, architecture, read_config
from theseus.sources.frozen_base import fingerprint
from theseus.sources.parse import parse_source
from theseus.sources.weights import load_params

TEXTS = ["Hello 12345 world", "  leading spaces\n\n\ttabs ", "émoji 🤖, 中文 and ß", "don't I'll we'VE",
         "<|im_start|>user\nhi<|im_end|>\n", "a<|endoftext|>b<think>c", "<s>x</s> <unk>", "", " ", "1234567 89",
         "<start_of_turn>user\nhi<end_of_turn>\n<mask>", "<|user|>\nhi <|end|>\n<|assistant|><|placeholder1|>",
         "a    b\t\t  c      d  ", CORPUS.read_text()[:2000]]


@pytest.fixture(scope="module", params=list(FAMILIES))
def model_file(request, tmp_path_factory):
    """(the transformers model, its GGUF file with 2-D weights in every kind in turn)."""
    model = random_model(FAMILIES[request.param]())
    return model, write_gguf(model, family_vocabulary(model), tmp_path_factory.mktemp("gguf") / "model.gguf",
                             kinds=EVERY_KIND)


def test_the_header_reads_as_the_gguf_package_reads_it(model_file):
    _, path = model_file
    ours, reader = open_gguf(path), gguf.GGUFReader(path)
    expected = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert ours.metadata.keys() == expected.keys()
    for name, value in expected.items():  # float32 values as their shortest decimal, the same float32
        assert ours.metadata[name] == (np.float32(value) if isinstance(value, float) else value), name
    assert ours.header_size == reader.data_offset
    assert {tensor.kind for tensor in ours.tensors.values()} == {*EVERY_KIND}  # every kind is exercised
    for tensor in reader.tensors:
        info = ours.tensors[tensor.name]
        assert (info.kind, info.shape, info.begin, info.end - info.begin) == (
            tensor.tensor_type, tuple(int(n) for n in reversed(tensor.shape)), tensor.data_offset, tensor.n_bytes)
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(info.shape)
        np.testing.assert_array_equal(ours.read(tensor.name), expected)


def test_config_is_the_one_transformers_derives(model_file):
    model, path = model_file
    reference = hf_model(path).config.to_dict()
    hf = config(path)
    rope = reference["rope_parameters"]
    for key, value in hf.items():
        expected = (rope.get(FULL, rope)["rope_theta"] if key == "rope_theta" else
                    rope[SLIDING]["rope_theta"] if key == "rope_local_base_freq" else reference[key])
        assert value == pytest.approx(expected), key
    assert architecture(hf) == architecture(model.config.to_dict())  # what the original folder gives theseus


def test_every_tensor_is_the_one_transformers_loads(model_file):
    model, path = model_file
    reference = hf_model(path).state_dict()
    with Tensors(path) as tensors:
        for name, value in reference.items():
            if name != "lm_head.weight" or not model.config.tie_word_embeddings:
                np.testing.assert_array_equal(tensors.read(name), value.numpy(), err_msg=name)
        assert tensors.unused() == []


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_float32_tensors_are_the_original_weights(kind, tmp_path):
    """llama.cpp's rotary permutation of q and k undone (Llama, Mistral) and the 1 it added to
    Gemma's norm gains taken off (to within float32's rounding of 1 + w), checked against the
    weights themselves."""
    model = random_model(FAMILIES[kind]())
    path = write_gguf(model, family_vocabulary(model), tmp_path / "model.gguf")
    with Tensors(path) as tensors:
        for name, value in model.state_dict().items():
            if name != "lm_head.weight" or not model.config.tie_word_embeddings:
                offset = kind.startswith("gemma") and name.endswith("norm.weight")
                np.testing.assert_allclose(tensors.read(name), value.numpy(), rtol=0, atol=2.5e-7 if offset else 0,
                                           err_msg=name)


def test_logits_equal_transformers(model_file):
    _, path = model_file
    _assert_logits(path, hf_model(path))


@pytest.fixture(scope="module", params=[pytest.param(name, marks=pytest.mark.slow) if name == "gemma3" else name
                                        for name in ORIGINALS])  # Gemma 3's six layers, one global: ~6 s a test
def original_file(request, tmp_path_factory):
    """(a model whose file holds what transformers' GGUF loader ignores, that file in float32)."""
    model = random_model(ORIGINALS[request.param]())
    return model, write_gguf(model, family_vocabulary(model), tmp_path_factory.mktemp("original") / "model.gguf")


def test_what_transformers_loader_ignores_is_read_as_llama_cpp_reads_it(original_file):
    """Llama 3.1's RoPE divisors as its ``llama3`` scaling, Gemma's soft-caps, windows, query scale
    (its head width), Gemma 3's global RoPE scaling and local base: the architecture and the
    logits of the model the file was written from."""
    model, path = original_file
    assert architecture(config(path)) == architecture(model.config.to_dict())
    _assert_logits(path, model)


def test_an_export_is_the_original_model_in_transformers(original_file, tmp_path):
    """``theseus.export FILE.gguf OUT``: a Hugging Face folder whose config.json states what the
    file holds (RoPE scaling, windows, soft-caps, query scale) and whose logits in transformers are
    the original model's."""
    model, path = original_file
    export(parse_source(path, key=None), tmp_path / "out")
    assert architecture(read_config(tmp_path / "out")) == architecture(model.config.to_dict())
    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, size=(2, 24))
    with torch.no_grad():
        expected = model(torch.from_numpy(tokens)).logits.numpy()
    np.testing.assert_allclose(hf_logits(tmp_path / "out", tokens), expected, atol=1e-5, rtol=0)


def _assert_logits(path, reference_model):
    """theseus's logits of the GGUF file at ``path`` within 1e-4 of their scale of
    ``reference_model``'s, computed in float64 (theseus's float32 is within rounding of them: at
    most 3e-5 of the scale, Gemma 2's soft-capped scores the farthest)."""
    gpt = theseus_model(path)
    params = load_params(path, arch_of(gpt), target_of(gpt))
    tokens = np.random.default_rng(0).integers(0, gpt.vocab_size, size=(2, 40))
    with torch.no_grad():
        reference = copy.deepcopy(reference_model).double()(torch.from_numpy(tokens)).logits.numpy()
    logits = np.asarray(jax.jit(gpt.apply)({"params": params}, jnp.asarray(tokens, jnp.int32)))
    scale = np.abs(reference).max()
    assert scale > 4.0  # Gemma 2's soft-cap of 5 bounds them
    np.testing.assert_allclose(logits, reference, atol=1e-4 * scale, rtol=0)


VOCABULARIES = {  # byte-level BPE under five pre-tokenizers, SentencePiece with and without merges, Gemma's and
    # Phi-3's (in files of their architectures); BOS added or not
    "gpt2-smollm": (lambda: byte_level_vocabulary("smollm", add_bos=False), "llama"),
    "gpt2-llama3-bos": (lambda: byte_level_vocabulary("llama-bpe", add_bos=True), "llama"),
    "gpt2-qwen2-unset": (lambda: byte_level_vocabulary("qwen2", add_bos=None), "qwen2"),
    "gpt2-tekken": (lambda: byte_level_vocabulary("tekken", add_bos=True), "llama"),  # Mistral Nemo's
    "gpt2-gpt4o": (lambda: byte_level_vocabulary("gpt-4o", add_bos=False), "phi3"),
    "sentencepiece-scores": (lambda: sentencepiece_vocabulary(merges=False, add_bos=None), "llama"),
    "sentencepiece-merges-nobos": (lambda: sentencepiece_vocabulary(merges=True, add_bos=False), "llama"),
    "gemma2": (gemma_vocabulary, "gemma2"),
    "gemma3": (gemma_vocabulary, "gemma3"),
    "phi3": (phi3_vocabulary, "phi3"),
}


@pytest.fixture(scope="module", params=list(VOCABULARIES))
def tokenizer_file(request, tmp_path_factory):
    vocabulary, arch = VOCABULARIES[request.param]
    return write_gguf(None, vocabulary(), tmp_path_factory.mktemp("tok") / f"{request.param}.gguf", arch=arch)


def test_token_ids_equal_transformers(tokenizer_file):
    ours, reference = HFTokenizer.from_file(tokenizer_file), transformers_tokenizer(tokenizer_file)
    for text in TEXTS:
        for special in (False, True):
            assert ours.encode(text, special) == reference(text, add_special_tokens=special)["input_ids"], text
        ids = reference(text)["input_ids"]
        assert ours.decode(ids) == reference.decode(ids)
    assert ours.vocab_size == len(reference)
    assert ours.eot == reference.eos_token_id
    added = reference("", add_special_tokens=True)["input_ids"]
    assert ours.prefix_token == (added[0] if added else ours.eot)


def test_the_pre_tokenizers_are_transformers():
    """Each ``tokenizer.ggml.pre`` splits text as transformers' GGUF loader splits it."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    assert SPLITS == GGUF_PRE_TOKENIZER_SPLITS


def test_chat_template_renders_as_transformers(tokenizer_file):
    reference = transformers_tokenizer(tokenizer_file)
    template = ChatTemplate.find(str(tokenizer_file))
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4, I think."}]
    assert template.source == CHATML
    assert template.special == {name: getattr(reference, name) for name in template.special}
    assert template.render(messages)[0] == reference.apply_chat_template(messages, tokenize=False)
    ids = reference.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=True, return_dict=False)
    chat = Conversation(None, None, HFTokenizer.from_file(tokenizer_file), template)  # what sample --chat renders
    assert chat.prompt("What is 2+2?").tolist() == ids


def test_an_exported_tokenizer_is_the_gguf_files_in_transformers(tokenizer_file, tmp_path):
    """What an export of a run from the file writes (tokenizer.json, tokenizer_config.json with the
    chat template) loads in transformers as the file itself does."""
    export_tokenizer(HFTokenizer.from_file(tokenizer_file), tmp_path, ChatTemplate.find(str(tokenizer_file)).settings())
    exported, reference = transformers.AutoTokenizer.from_pretrained(tmp_path), transformers_tokenizer(tokenizer_file)
    for text in TEXTS:
        assert exported(text)["input_ids"] == reference(text)["input_ids"], text
        assert exported.decode(reference(text)["input_ids"]) == reference.decode(reference(text)["input_ids"])
    messages = [{"role": "user", "content": "hi"}]
    assert exported.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_a_corpus_tokenized_by_a_gguf_file_holds_transformers_ids(tmp_path):
    """``data.tokenizer=FILE.gguf``: each document's ids as transformers' tokenizer of the file
    gives them, then its eos; the cache keyed by the file's metadata."""
    path = write_gguf(None, byte_level_vocabulary(), tmp_path / "tokenizer.gguf")
    documents = [CORPUS.read_text()[:3000], "é 🤖 <|im_end|> 12345\n"]
    for i, document in enumerate(documents):
        (tmp_path / "corpus" / f"{i}.txt").parent.mkdir(exist_ok=True)
        (tmp_path / "corpus" / f"{i}.txt").write_text(document)
    data = DataConfig(source="text", path=str(tmp_path / "corpus"), tokenizer=str(path), val_fraction=0.1,
                      cache_dir=str(tmp_path / "cache"))
    dataset = open_dataset(data)
    reference = transformers_tokenizer(path)
    expected = [i for document in documents for i in [*reference(document)["input_ids"], reference.eos_token_id]]
    held = np.concatenate([dataset.tokens["train"], dataset.tokens["val"]]).tolist()
    assert sorted(held) == sorted(expected) and dataset.tokenizer.eot == reference.eos_token_id == 2
    assert open_dataset(data).folder == dataset.folder  # prepared once


def test_a_fingerprint_follows_the_weights_not_the_name(model_file, tmp_path):
    _, path = model_file
    copy = shutil.copy(path, tmp_path / "renamed.gguf")
    assert fingerprint(copy) == fingerprint(path)
    data = bytearray(copy.read_bytes())
    data[open_gguf(path).tensors["blk.1.ffn_up.weight"].begin + 7] ^= 1  # one bit of one tensor amid the others
    copy.write_bytes(data)
    assert fingerprint(copy) != fingerprint(path)


def test_files_theseus_cannot_read_are_refused_in_one_line(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(ConfigError, match=r"notes.gguf does not read as a GGUF file \(it does not begin with the "):
        config(text)
    model = random_model(llama_config())
    whole = write_gguf(model, byte_level_vocabulary(), tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-1000])
    with pytest.raises(ConfigError, match=r"cut.gguf does not read as a GGUF file \(tensor .* runs past the end"):
        config(cut)
    with pytest.raises(ConfigError, match=r"absent.gguf does not exist: give the path of a GGUF model file"):
        config(tmp_path / "absent.gguf")


@pytest.mark.parametrize("change, message", [
    ({"general.architecture": "bloom"}, r"a GGUF model of architecture 'bloom' is not supported; theseus reads llama"),
    ({"llama.rope.scaling.type": "yarn"}, r"RoPE scaling 'yarn' is not supported"),
    ({"llama.expert_count": 8}, r"a mixture of experts in a GGUF file \(llama.expert_count=8\) is not supported"),
    ({"tensor": ("rope_freqs.weight", np.full(32, 2.0, np.float32))},
     r"RoPE frequency divisors \(rope_freqs.weight\) other than Llama 3's are not supported \(theseus computes llama3"),
    ({"tensor": ("rope_factors_long.weight", np.ones(32, np.float32))},
     r"RoPE scaling 'longrope' \(rope_factors_long.weight, Phi-3's long context\) is not supported"),
    ({"llama.rope.dimension_count": 32}, r"RoPE over 32 of each head's 64 dimensions is not supported"),
    ({"tokenizer.ggml.model": "t5"}, r"a 't5' tokenizer of a llama model is not supported"),
    ({"split.count": 3}, r"b.gguf is one of 3 parts of a GGUF model: merge them into one file"),
])
def test_what_theseus_does_not_compute_is_refused_in_one_line(tmp_path, change, message):
    path = _edited(write_gguf(random_model(llama_config()), byte_level_vocabulary(), tmp_path / "a.gguf"),
                   tmp_path / "b.gguf", change)
    with pytest.raises(ConfigError, match=message) as refused:
        architecture(config(path))  # the model ...
        HFTokenizer.from_file(path)  # ... or its tokenizer
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("family, change, expected", [
    # llama.cpp computes Phi-3 without the window its converter writes
    ("phi3", {"phi3.attention.sliding_window": 2047}, {"sliding_window": None}),
    # Gemma's 27B (by its layer count) scales its queries by d_model / heads, every other size by its head width
    ("gemma2", {"gemma2.block_count": 46}, {"attn_scale_dim": 64}),
    ("gemma3", {"gemma3.block_count": 62}, {"attn_scale_dim": 64}),
    ("gemma2", {"gemma2.block_count": 26}, {"attn_scale_dim": 256}),
    # which layers slide, as a period or one flag per layer
    ("gemma3", {"gemma3.attention.sliding_window_pattern": 2}, {"global_every": 2}),
    ("gemma3", {"gemma3.attention.sliding_window_pattern": [True, False]}, {"global_every": 2}),
    ("gemma2", {"gemma2.attention.sliding_window": 0}, {"sliding_window": None, "global_every": 0}),
    # a RoPE factor without a type is linear, as llama.cpp reads it; Llama 3.1's divisors all 1 scale nothing
    ("llama", {"llama.rope.scaling.factor": 4.0}, {"rope_scaling.type": "linear", "rope_scaling.factor": 4.0}),
    ("llama", {"tensor": ("rope_freqs.weight", np.ones(32, np.float32))}, {"rope_scaling.type": "none"}),
])
def test_the_architecture_is_what_llama_cpp_computes_from_the_file(tmp_path, family, change, expected):
    """Metadata transformers' GGUF loader does not read (or reads otherwise), as llama.cpp does."""
    model = random_model(FAMILIES[family]())
    path = _edited(write_gguf(model, family_vocabulary(model), tmp_path / "a.gguf"), tmp_path / "b.gguf", change)
    arch = architecture(config(path))
    assert {key: arch[key] for key in expected} == expected


def test_implied_merges_are_transformers():
    """The merges a SentencePiece file without any implies (ranked by score; Gemma's by id) are
    transformers' ``generate_merges``, ties included."""
    from transformers.tokenization_utils_base import generate_merges

    spaced, gemma = sentencepiece_vocabulary(), gemma_vocabulary()
    repeated = ["a", "b", "aa", "aaa", "ab", "bb", "aab", "abb", "aaaa"]  # cuts of one token tie: their order shows
    for tokens, scores in [(spaced.tokens, spaced.scores), (repeated, [0, 0, -1, -2, -3, -4, -5, -6, -7]),
                           (gemma.tokens, [-float(i) for i in range(len(gemma.tokens))])]:
        expected = generate_merges({token: i for i, token in enumerate(tokens)}, dict(zip(tokens, scores)))
        assert _implied_merges(tokens, scores) == expected


def _edited(path, out, change):
    """``path`` rewritten as ``out`` with metadata values changed or added (``"tensor"``: a
    float32 tensor ``(name, value)`` added)."""
    reader = gguf.GGUFReader(path)
    metadata = {name: (field.contents(), field.types) for name, field in reader.fields.items()
                if not name.startswith("GGUF.")}
    writer = gguf.GGUFWriter(str(out), change.get("general.architecture", metadata["general.architecture"][0]))
    for name, (value, types) in metadata.items():
        if name == "general.architecture":
            continue
        value = change.get(name, value)
        writer.add_key_value(name, value, types[0], sub_type=types[-1] if len(types) > 1 else None)
    added = {bool: writer.add_bool, int: writer.add_uint32, float: writer.add_float32, str: writer.add_string,
             list: writer.add_array}
    for name, value in change.items():
        if name not in metadata and name != "tensor":
            added[type(value)](name, value)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    if "tensor" in change:
        writer.add_tensor(*change["tensor"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
