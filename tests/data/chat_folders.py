"""Local Hugging Face tokenizer folders with chat templates (nothing downloaded): a ChatML one
whose template marks ``{% generation %}`` and a Llama-3-style one whose template does not."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
from support import TEXT
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

CORPUS = TEXT

# ChatML (Qwen2's layout), with the assistant's content and <|im_end|> inside {% generation %}
CHATML = """{%- for message in messages %}
    {%- if message['role'] == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}
        {{- '\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Meta's Llama 3 template, as its tokenizer_config.json ships it (no {% generation %})
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

CONVERSATIONS = [
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "What is a tokenizer?"},
     {"role": "assistant", "content": "It maps text to ids."},
     {"role": "user", "content": "And back?"},
     {"role": "assistant", "content": "decode(encode(text)) == text, naïvely ✓."}],
    [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": " hi "}],
]


def bpe(special: list[str], vocab_size: int = 400) -> tokenizers.Tokenizer:
    """A byte-level BPE trained on a local file, with ``special`` tokens."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([CORPUS.read_text()], trainer)
    return tokenizer


def chatml_folder(folder: Path) -> Path:
    """A tokenizer folder whose tokenizer_config.json holds the ChatML template."""
    folder.mkdir(parents=True, exist_ok=True)
    bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]).save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "chat_template": CHATML}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def chatml_bos_folder(folder: Path) -> Path:
    """A BPE with ChatML's tokens and a BOS its post-processor adds (as Llama's), ``<|im_end|>`` its eos."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"])
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 3)])
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "bos_token": "<s>",
              "pad_token": "<|endoftext|>", "chat_template": CHATML}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def llama3_folder(folder: Path) -> Path:
    """A tokenizer folder with the Llama 3 template in chat_template.jinja (transformers 5's layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    bpe(["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]).save(
        str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "special": True},
              "eos_token": "<|eot_id|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(LLAMA3)
    return folder
