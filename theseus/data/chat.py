"""Chat templates: a conversation rendered and tokenized as transformers' ``apply_chat_template``
renders and tokenizes it, with the mask of the tokens its loss covers.

    template = ChatTemplate.find(tokenizer_path, given=None)   # the tokenizer's, or DEFAULT_TEMPLATE
    ids, mask = encode_chat(template, tokenizer, messages)     # int32 [n], bool [n]: the assistant's tokens

The template is Jinja, in a sandboxed environment set up as transformers sets it up
(``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, the ``{% generation %}`` tag,
``raise_exception``, ``strftime_now``, a ``tojson`` that does not escape HTML), and sees the
tokenizer's special tokens (``bos_token``, ``eos_token``, ...) as transformers passes them. The
rendered text is tokenized whole, special tokens recognised, none added (transformers'
``add_special_tokens=False``).

The mask: a template that marks ``{% generation %}`` gives transformers' ``assistant_masks`` (a
token is in it when its characters overlap text rendered inside the tag); one that does not is
rendered turn by turn, an assistant turn's span running from the end of the generation prompt
before it to the end of its message, less trailing whitespace (its content and end-of-turn token,
not its header nor the newline after it).
"""

from __future__ import annotations

import dataclasses
import json
import re
import weakref
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
import numpy as np
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

from theseus.config import ConfigError
from theseus.data import gguf_tokenizer
from theseus.data.gguf_file import is_gguf, open_gguf
from theseus.data.tokenizer import EOT, NAMES, TRANSFORMERS_CONFIG, Tokenizer

TEMPLATE_FILE = "chat_template.jinja"  # where transformers 5's save_pretrained writes the template
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
ROLES = ("system", "user", "assistant")
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")

# theseus's own tokenizers (byte, char and bpe, the last two fitted to the rendered conversations)
# have one special token, <|endoftext|>: it ends every turn
DEFAULT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{% generation %}{{- message['content'] + eos_token -}}{% endgeneration %}"
    "{%- else -%}"
    "{{- message['content'] + eos_token -}}"
    "{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A chat template's Jinja ``source``, the special tokens it sees, and where it came from."""

    source: str
    special: Mapping[str, str]  # bos_token, eos_token, ...: what transformers passes the template
    origin: str  # data.chat_template=FILE, the tokenizer's file, or "theseus's default template"

    def __post_init__(self):
        """ConfigError naming the template's origin when it does not parse as Jinja."""
        try:
            _compile(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"the chat template ({self.origin}) does not parse as Jinja (line {exc.lineno}: "
                              f"{exc.message}): fix the template") from None

    @classmethod
    def find(cls, tokenizer: str, given: str | None = None, key: str = "data.chat_template") -> ChatTemplate:
        """The template a run uses: ``given`` (``data.chat_template``, or the option ``key``: a
        Jinja file, or a tokenizer_config.json holding one) if set, else the tokenizer's (``own``),
        else, for theseus's byte, char and bpe tokenizers, ``DEFAULT_TEMPLATE``. ConfigError when
        there is none or a file does not read."""
        if given is not None:
            return cls(_given_source(given, key), _special_tokens(tokenizer), f"{key}={given}")
        own = cls.own(tokenizer)
        if own is not None:
            return own
        if tokenizer in NAMES:
            return cls(DEFAULT_TEMPLATE, _special_tokens(tokenizer), "theseus's default template")
        where = ("tokenizer.chat_template in its metadata" if is_gguf(tokenizer)
                 else f"{TEMPLATE_FILE} or a chat_template in {TRANSFORMERS_CONFIG} beside it")
        raise ConfigError(f"the tokenizer {tokenizer} has no chat template ({where}): set data.chat_template to a "
                          f"Jinja file")

    @classmethod
    def found(cls, tokenizer: str, given: str | None = None) -> ChatTemplate | None:
        """``find``'s template, or None where there is none (a task whose rows may be plain text
        or conversations: dpo's pairs, grpo's prompts). A ``given`` file that does not read is
        still a ConfigError."""
        try:
            return cls.find(tokenizer, given)
        except ConfigError:
            if given is not None:
                raise
            return None

    @classmethod
    def own(cls, tokenizer: str) -> ChatTemplate | None:
        """The template the tokenizer ``data.tokenizer`` names holds: a GGUF file's
        ``tokenizer.chat_template``; ``chat_template.jinja`` beside a tokenizer.json, else its
        tokenizer_config.json's ``chat_template``. None for theseus's own tokenizers and one without."""
        if tokenizer in NAMES:
            return None
        special = _special_tokens(tokenizer)
        if is_gguf(tokenizer):
            file = open_gguf(tokenizer)
            source, origin = gguf_tokenizer.chat_template(file), f"{file.path}'s tokenizer.chat_template"
        else:
            folder = Path(tokenizer).expanduser().parent
            if (folder / TEMPLATE_FILE).is_file():
                return cls((folder / TEMPLATE_FILE).read_text(encoding="utf-8"), special, str(folder / TEMPLATE_FILE))
            source, origin = _tokenizer_config(folder).get("chat_template"), str(folder / TRANSFORMERS_CONFIG)
        source = _default_template(source)
        return cls(source, special, origin) if isinstance(source, str) else None

    def settings(self) -> dict[str, str]:
        """What transformers reads from a tokenizer_config.json to render as this template renders:
        ``chat_template`` and the special tokens it sees."""
        return {**self.special, "chat_template": self.source}

    @property
    def marks_generation(self) -> bool:
        """Whether the template marks the assistant's text with ``{% generation %}``."""
        return GENERATION_TAG.search(self.source) is not None

    def render(self, messages: Sequence[Mapping], add_generation_prompt: bool = False) -> tuple[str, list[tuple[int, int]]]:
        """The text of ``messages`` and the character spans rendered inside ``{% generation %}``."""
        compiled = _compile(self.source)
        blocks: list[str] = []
        spans: list[tuple[int, int]] = []
        try:
            with compiled.environment.track(blocks, spans):
                for block in compiled.generate(messages=[dict(m) for m in messages], tools=None, documents=None,
                                               add_generation_prompt=add_generation_prompt, **self.special):
                    blocks.append(block)  # noqa: PERF402 (one at a time: the tag reads what came before it)
        except Exception as exc:  # raise_exception's TemplateError, or Python's own (a number added to a string)
            said = str(exc) if isinstance(exc, jinja2.TemplateError) else f"{type(exc).__name__}: {exc}"
            raise ConfigError(f"the chat template ({self.origin}) fails on a conversation: {said}") from exc
        return "".join(blocks), spans

    def assistant_spans(self, messages: Sequence[Mapping]) -> tuple[str, list[tuple[int, int]]]:
        """The text of ``messages`` and the character spans of the assistant's turns (see the module)."""
        text, spans = self.render(messages)
        if self.marks_generation:
            return text, spans
        spans = []
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            prompt, _ = self.render(messages[:i], add_generation_prompt=True)
            upto, _ = self.render(messages[: i + 1])
            if not (text.startswith(upto) and upto.startswith(prompt)):
                raise ConfigError(f"the chat template ({self.origin}) does not render a conversation as the "
                                  "concatenation of its turns, so its assistant turns cannot be found: mark them with "
                                  "{% generation %} ... {% endgeneration %} (as transformers' assistant masks need)")
            spans.append((len(prompt), len(upto.rstrip())))
        return text, spans

    def end_of_turn(self, tokenizer: Tokenizer) -> int:
        """The token that ends an assistant turn: the last token the template renders after an
        assistant message's text (ChatML's ``<|im_end|>``, Llama 3's ``<|eot_id|>``)."""
        probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
        text, spans = self.assistant_spans(probe)
        _, end = spans[-1]
        ids, offsets = tokenize(tokenizer, text)
        inside = [i for i, (a, b) in enumerate(offsets) if a < end and b > end - 1]
        if not inside:
            raise ConfigError(f"the chat template ({self.origin}) renders no end-of-turn token")
        return int(ids[inside[-1]])


def _given_source(given: str, key: str) -> str:
    """The Jinja source ``key=given`` (``data.chat_template=FILE``) names: the file's text, or,
    for a tokenizer_config.json (a JSON object), its ``chat_template``; ConfigError naming the file
    when it is missing or such a JSON file holds no template."""
    path = Path(given).expanduser()
    if not path.is_file():
        raise ConfigError(f"{key}={given} does not exist: give the path of a Jinja chat template")
    text = path.read_text(encoding="utf-8")
    try:
        settings = json.loads(text)
    except ValueError:
        return text  # Jinja
    source = _default_template(settings.get("chat_template")) if isinstance(settings, dict) else None
    if not isinstance(source, str):
        raise ConfigError(f"{key}={given} is a JSON file without a chat_template (a "
                          f"{TRANSFORMERS_CONFIG} of a model that is not a chat model?): give a Jinja file, or the "
                          f"{TRANSFORMERS_CONFIG} of a chat model")
    return source


def _default_template(source: object) -> object:
    """A ``chat_template`` setting as one template: transformers' named templates (``[{"name": ...,
    "template": ...}]``) give their ``default``; a string stays."""
    if isinstance(source, list):
        named = {entry.get("name"): entry.get("template") for entry in source if isinstance(entry, Mapping)}
        return named.get("default")
    return source


def _special_tokens(tokenizer: str) -> dict[str, str]:
    """The named special tokens a template sees with ``data.tokenizer``: a GGUF file's, those of
    the tokenizer_config.json beside a tokenizer.json, or theseus's <|endoftext|> as eos."""
    if tokenizer in NAMES:
        return {"eos_token": EOT}
    if is_gguf(tokenizer):
        return gguf_tokenizer.special_tokens(open_gguf(tokenizer))
    return tokenizer_special_tokens(Path(tokenizer).expanduser().parent)


def tokenizer_special_tokens(folder: Path) -> dict[str, str]:
    """The named special tokens of the tokenizer_config.json in ``folder`` (as transformers'
    ``special_tokens_map``: the set ones, as strings)."""
    settings = _tokenizer_config(folder)
    found = {}
    for name in SPECIAL_TOKENS:
        value = settings.get(name)
        value = value.get("content") if isinstance(value, Mapping) else value
        if isinstance(value, str):
            found[name] = value
    return found


def _tokenizer_config(folder: Path) -> dict:
    path = folder / TRANSFORMERS_CONFIG
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path} is not JSON ({exc}): fix it or remove it") from exc


def tokenize(tokenizer: Tokenizer, text: str, special: bool = False) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The ids of ``text`` (special tokens recognised; ``special``: those the tokenizer adds, a BOS,
    added as transformers' ``tokenizer(text)`` adds them) and each token's character span."""
    encoding = _as_hf(tokenizer).encode(text, add_special_tokens=special)
    return np.asarray(encoding.ids, dtype=np.int32), encoding.offsets


_HF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _as_hf(tokenizer: Tokenizer) -> tokenizers.Tokenizer:
    """``tokenizer.as_hf()``, made once per tokenizer (byte's is built on each call)."""
    if tokenizer not in _HF:
        _HF[tokenizer] = tokenizer.as_hf()
    return _HF[tokenizer]


def token_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """``bool [n]``: the tokens whose characters overlap one of ``spans`` (transformers' rule)."""
    mask = np.zeros(len(offsets), dtype=bool)
    at = 0
    for i, (start, end) in enumerate(offsets):
        while at < len(spans) and start >= spans[at][1]:
            at += 1
        if at == len(spans):
            break
        mask[i] = end > spans[at][0]
    return mask


def encode_chat(template: ChatTemplate, tokenizer: Tokenizer, messages: Sequence[Mapping],
                train_on: str = "assistant") -> tuple[np.ndarray, np.ndarray]:
    """``(ids int32 [n], mask bool [n])`` of a conversation: the target at position t counts in
    the loss when ``mask[t]``. ``train_on=assistant``: the assistant's tokens; ``all``: every
    token but the first (which nothing predicts)."""
    return encode_rendered(*template.assistant_spans(messages), tokenizer, train_on)


def encode_rendered(text: str, spans: Sequence[tuple[int, int]], tokenizer: Tokenizer,
                    train_on: str = "assistant") -> tuple[np.ndarray, np.ndarray]:
    """``encode_chat`` of a conversation already rendered: its ``text`` and assistant ``spans``."""
    ids, offsets = tokenize(tokenizer, text)
    mask = np.ones(len(ids), bool) if train_on == "all" else token_mask(offsets, spans)
    mask[:1] = False  # nothing predicts the first token (packed, it would be the previous conversation)
    return ids, mask


def check_messages(messages: object, where: str) -> list[dict]:
    """``messages`` as a list of ``{role, content}`` dicts; ConfigError naming ``where`` otherwise."""
    if not isinstance(messages, list) or not messages:
        raise ConfigError(f"{where} must be a non-empty list of {{role, content}} messages, got {messages!r:.80}")
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str) \
                or message.get("role") not in ROLES:
            raise ConfigError(f"{where} holds {message!r:.80}: each message needs a role among "
                              f"{', '.join(ROLES)} and a string content")
    return [dict(message) for message in messages]


class _GenerationTracker(jinja2.ext.Extension):
    """``{% generation %} ... {% endgeneration %}``: renders its body and, while tracking, records
    the body's character span in the text rendered so far (transformers' AssistantTracker)."""

    tags: ClassVar[set[str]] = {"generation"}

    def __init__(self, environment: jinja2.Environment):
        super().__init__(environment)
        environment.extend(track=self.track)
        self._tracking: ContextVar = ContextVar("theseus_generation", default=None)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation(self, context: jinja2.nodes.EvalContext, caller: jinja2.runtime.Macro) -> str:
        text = caller()
        tracking = self._tracking.get()
        if tracking is not None:
            blocks, spans = tracking
            start = len("".join(blocks))
            spans.append((start, start + len(text)))
        return text

    @contextmanager
    def track(self, blocks: list[str], spans: list[tuple[int, int]]):
        token = self._tracking.set((blocks, spans))
        try:
            yield
        finally:
            self._tracking.reset(token)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    """``source`` compiled in transformers' sandboxed environment (TemplateSyntaxError when it does
    not parse)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
