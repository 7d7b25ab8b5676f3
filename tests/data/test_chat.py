"""Chat templates render and tokenize as transformers' apply_chat_template, with its assistant masks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from data.chat_folders import CHATML, CONVERSATIONS, LLAMA3, chatml_folder, llama3_folder

from theseus.config import ConfigError
from theseus.data.chat import DEFAULT_TEMPLATE, ChatTemplate, check_messages, encode_chat
from theseus.data.chat_corpus import chat_tokenizer
from theseus.data.config import DataConfig
from theseus.data.tokenizer import EOT, ByteTokenizer, HFTokenizer, export_tokenizer

transformers = pytest.importorskip("transformers")


def both(folder: Path):
    """``(template, tokenizer, transformers' tokenizer)`` of a tokenizer folder."""
    return (ChatTemplate.find(str(folder / "tokenizer.json")), HFTokenizer.from_file(folder / "tokenizer.json"),
            transformers.AutoTokenizer.from_pretrained(folder))


@pytest.mark.parametrize("make", [chatml_folder, llama3_folder])
def test_token_ids_equal_transformers(tmp_path, make):
    template, tokenizer, reference = both(make(tmp_path / "tok"))
    for messages in CONVERSATIONS:
        ids, _ = encode_chat(template, tokenizer, messages)
        assert ids.tolist() == reference.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        prompt, _ = template.render(messages[:1], add_generation_prompt=True)
        assert prompt == reference.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)


def test_generation_mask_equals_transformers_assistant_masks(tmp_path):
    template, tokenizer, reference = both(chatml_folder(tmp_path / "tok"))
    for messages in CONVERSATIONS:
        _, mask = encode_chat(template, tokenizer, messages)
        out = reference.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
        assert mask.astype(int).tolist() == out["assistant_masks"]
        # what the mask covers: the content and <|im_end|>, not the header nor the newline after
        text = reference.decode([t for t, m in zip(out["input_ids"], mask) if m])
        assert text == "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")


def test_turn_by_turn_mask_equals_the_generation_marked_template(tmp_path):
    """Llama 3's template has no {% generation %}: its turns, found by rendering turn by turn,
    mask what transformers masks for the same template with the content and <|eot_id|> marked."""
    template, tokenizer, reference = both(llama3_folder(tmp_path / "tok"))
    assert not template.marks_generation
    marked = LLAMA3.replace("{{ content }}", "{% if message['role'] == 'assistant' %}"
                            "{{ content[:-(message['content'] | trim | length) - 10] }}{% generation %}"
                            "{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
                            "{% else %}{{ content }}{% endif %}")
    for messages in CONVERSATIONS:
        ids, mask = encode_chat(template, tokenizer, messages)
        out = reference.apply_chat_template(messages, chat_template=marked, return_dict=True,
                                            return_assistant_tokens_mask=True)
        assert out["input_ids"] == ids.tolist()
        assert mask.astype(int).tolist() == out["assistant_masks"]
        assert sum(out["assistant_masks"]) > 0


def test_train_on_all_masks_every_token_but_the_first(tmp_path):
    folder = chatml_folder(tmp_path / "tok")
    template = ChatTemplate.find(str(folder / "tokenizer.json"))
    ids, mask = encode_chat(template, HFTokenizer.from_file(folder / "tokenizer.json"), CONVERSATIONS[0], "all")
    assert mask.tolist() == [False] + [True] * (len(ids) - 1)


def test_template_sources_in_order(tmp_path):
    folder = llama3_folder(tmp_path / "tok")
    assert ChatTemplate.find(str(folder / "tokenizer.json")).origin.endswith("chat_template.jinja")
    given = tmp_path / "mine.jinja"
    given.write_text(CHATML)
    assert ChatTemplate.find(str(folder / "tokenizer.json"), str(given)).source == CHATML
    assert ChatTemplate.find("byte").source == ChatTemplate.find("char").source == ChatTemplate.find("bpe").source \
        == DEFAULT_TEMPLATE
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(ConfigError, match="has no chat template .* set data.chat_template to a Jinja file"):
        ChatTemplate.find(str(folder / "tokenizer.json"))


def test_a_tokenizer_config_given_as_the_template_gives_its_template(tmp_path):
    """data.chat_template=tokenizer_config.json (a chat model's, or one without a template: named,
    where it rendered the JSON as text before and no turn was found)."""
    chatml = chatml_folder(tmp_path / "chatml") / "tokenizer_config.json"
    template = ChatTemplate.find("byte", str(chatml))
    assert template.source == CHATML and template.origin == f"data.chat_template={chatml}"
    named = tmp_path / "named.json"
    named.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "x"},
                                                   {"name": "default", "template": CHATML}]}))
    assert ChatTemplate.find("byte", str(named)).source == CHATML
    plain = tmp_path / "tokenizer_config.json"
    plain.write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(ConfigError) as err:
        ChatTemplate.find("byte", str(plain))
    assert str(err.value) == (f"data.chat_template={plain} is a JSON file without a chat_template (a "
                              f"tokenizer_config.json of a model that is not a chat model?): give a Jinja file, or "
                              f"the tokenizer_config.json of a chat model")


def test_default_template_ends_turns_with_endoftext():
    template, tokenizer = ChatTemplate.find("byte"), ByteTokenizer()
    messages = CONVERSATIONS[1]
    ids, mask = encode_chat(template, tokenizer, messages)
    text, _ = template.render(messages)
    assert text == "<|user|>\nSay hi.<|endoftext|>\n<|assistant|>\n hi <|endoftext|>\n"
    assert tokenizer.decode(ids) == text
    assert bytes(ids[mask][:-1].astype(np.uint8)).decode() == " hi " and ids[mask][-1] == tokenizer.eot
    assert template.end_of_turn(tokenizer) == tokenizer.eot


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_default_template_with_a_vocabulary_fitted_to_the_conversations(tmp_path, kind):
    """char and bpe fitted to the rendered conversations hold <|endoftext|> as one token, which
    ends each turn: the ids and the mask are transformers' apply_chat_template's (the tokenizer and
    template exported), the mask each reply and its <|endoftext|>, as byte's."""
    template = ChatTemplate.find(kind)
    texts = [template.render(messages)[0] for messages in CONVERSATIONS]
    tokenizer = chat_tokenizer(DataConfig(tokenizer=kind, bpe_vocab_size=300), texts, template)
    if kind == "char":  # the characters rendered, <|endoftext|> apart, then it
        assert tokenizer.symbols == "".join(sorted(set("".join(texts).replace(EOT, "")))) and \
            tokenizer.eot == tokenizer.vocab_size - 1
    export_tokenizer(tokenizer, tmp_path, template.settings())
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for messages, text in zip(CONVERSATIONS, texts):
        ids, mask = encode_chat(template, tokenizer, messages)
        out = reference.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
        assert ids.tolist() == out["input_ids"] and mask.tolist() == [bool(m) for m in out["assistant_masks"]]
        assert tokenizer.decode(ids.tolist()) == text and ids.tolist().count(tokenizer.eot) == len(messages)
        masked = ids[mask]
        replies = np.split(masked, np.flatnonzero(masked == tokenizer.eot)[:-1] + 1)
        assert [tokenizer.decode(reply.tolist()) for reply in replies] == \
            [m["content"] + EOT for m in messages if m["role"] == "assistant"]
    assert template.end_of_turn(tokenizer) == tokenizer.eot


def test_end_of_turn_tokens(tmp_path):
    for make, name in [(chatml_folder, "<|im_end|>"), (llama3_folder, "<|eot_id|>")]:
        folder = make(tmp_path / name)
        tokenizer = HFTokenizer.from_file(folder / "tokenizer.json")
        assert ChatTemplate.find(str(folder / "tokenizer.json")).end_of_turn(tokenizer) == \
            tokenizer.as_hf().token_to_id(name)


def test_template_errors(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ raise_exception('no ' + m['role']) }}{% endfor %}")
    template = ChatTemplate.find("byte", str(bad))
    with pytest.raises(ConfigError, match=r"the chat template \(.*bad.jinja\) fails on a conversation: no user"):
        template.render(CONVERSATIONS[1])
    with pytest.raises(ConfigError, match="each message needs a role among system, user, assistant"):
        check_messages([{"role": "bot", "content": "x"}], "row 3")
    with pytest.raises(ConfigError, match="does not exist"):
        ChatTemplate.find("byte", str(tmp_path / "missing.jinja"))
