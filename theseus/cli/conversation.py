"""A conversation with a trained model, its replies streamed as they are made.

    chat = Conversation.of(trained, system="You are terse.", sampling=Sampling(temperature=0.0))
    chat.say("What is a tokenizer?", on_text=print)   # Reply(text, ids); its text handed out piece by piece
    chat.say("And back?").text                        # rendered over the whole history
    chat.reset()                                      # the system message alone again

Each turn renders the whole history (the system message, every user message and reply so far)
by the chat template with its generation prompt, as transformers' ``apply_chat_template(...,
add_generation_prompt=True)`` does, and generates the reply until the template's end-of-turn
token or the tokenizer's end of text (``theseus.model.generate.complete``, one row). The
reply's text (its ids decoded, the stop token left out) joins the history as the assistant's
message. Turn ``n`` draws with ``fold_in(jax.random.key(seed), n)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np

from theseus.config import ConfigError, configured
from theseus.config.registry import chosen
from theseus.data.chat import ChatTemplate, tokenize
from theseus.data.config import DataConfig
from theseus.data.tokenizer import Tokenizer
from theseus.model.generate import complete
from theseus.model.sampling import Sampling
from theseus.tasks.task import chat_template_of


class TextStream:
    """The text of a growing list of token ids, handed out as it becomes final: the ids decoded
    whole each time, the text held back while it ends in an unfinished character (U+FFFD, a
    multi-byte character's first bytes), so that every piece is whole characters; as a terminal may
    show it (``Tokenizer.printable``: control characters and bytes that are no character's as ``\\xNN``)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.shown = ""

    def add(self, ids: Sequence[int]) -> str:
        """The text that ``ids`` complete (empty while a character is unfinished)."""
        self.ids.extend(ids)
        return "" if self.tokenizer.decode(self.ids).endswith("\ufffd") else self.close()

    def close(self) -> str:
        """The text not handed out yet (an unfinished character's bytes included)."""
        return self._new(self.tokenizer.printable(self.ids))

    def _new(self, text: str) -> str:
        new, self.shown = text[len(self.shown):], text
        return new


class Reply(NamedTuple):
    """A reply: its text and the ids it decodes from (the stop token left out)."""

    text: str
    ids: list[int]


class Conversation:
    """A chat with ``model`` (its ``params``), rendered by ``template`` (see the module)."""

    def __init__(self, model: nn.Module, params: Any, tokenizer: Tokenizer, template: ChatTemplate,
                 system: str | None = None, sampling: Sampling = Sampling(), max_new_tokens: int = 200, seed: int = 0):
        self.model, self.params, self.tokenizer, self.template = model, params, tokenizer, template
        self.system, self.sampling, self.max_new_tokens, self.seed = system, sampling, max_new_tokens, seed
        ends = [template.end_of_turn(tokenizer), tokenizer.eot]
        self.stop_tokens = sorted({token for token in ends if token is not None})
        self.reset()

    @classmethod
    def of(cls, trained: Any, chat_template: str | None = None, **kwargs) -> Conversation:
        """A conversation with a trained model (``theseus.cli.trained.Trained``) by ``chat_template``
        (a file: ``--chat-template``) if given, else by the model's own: the one its task rendered
        conversations with (``sft``, ``dpo``, ``grpo``: ``data.chat_template``, the tokenizer's, or
        theseus's default for byte), else its tokenizer's. ConfigError when it has none (a model
        trained on text by a tokenizer without one: its replies would be noise)."""
        data = configured(DataConfig, trained.cfg)
        if chat_template is not None:
            template = ChatTemplate.find(data.tokenizer, chat_template, key="--chat-template")
        else:
            template = chat_template_of(trained.cfg)
        if template is None:
            run = f"a run of task={chosen(trained.cfg, 'task')}; " if not trained.source.imported else ""
            raise ConfigError(f"{trained.source} has no chat template ({run}its tokenizer {data.tokenizer} holds "
                              f"none): give one with --chat-template FILE (a Jinja file, or a chat model's "
                              f"tokenizer_config.json), or continue text with --prompt")
        return cls(trained.model, trained.params, trained.tokenizer, template, **kwargs)

    def reset(self) -> None:
        """Forget every turn (the system message stays)."""
        self.messages: list[dict[str, str]] = [] if self.system is None else [{"role": "system", "content": self.system}]
        self.turns = 0

    def prompt(self, message: str) -> np.ndarray:
        """``int32[n]``: the history and a user's ``message`` rendered with the generation prompt;
        ValueError for a character a char vocabulary lacks (its Hugging Face form would drop it)."""
        self.tokenizer.encode(message)
        text, _ = self.template.render([*self.messages, {"role": "user", "content": message}],
                                       add_generation_prompt=True)
        return tokenize(self.tokenizer, text)[0]

    def say(self, message: str, on_text: Callable[[str], None] | None = None) -> Reply:
        """The model's reply to a user's ``message``, which joins the history with it;
        ``on_text`` receives the reply's text as it is made (whole characters at a time, printable:
        ``TextStream``)."""
        prompt = self.prompt(message)
        stream = TextStream(self.tokenizer)

        def show(tokens: np.ndarray) -> None:
            ids = tokens[0].tolist()
            ends = [i for i, token in enumerate(ids) if token in self.stop_tokens]
            piece = stream.add(ids[: ends[0]] if ends else ids)
            if piece:
                on_text(piece)

        key = jax.random.fold_in(jax.random.key(self.seed), self.turns)
        out = complete(self.model, self.params, prompt[None], [len(prompt)], self.max_new_tokens, self.sampling,
                       keys=key[None], stop_tokens=self.stop_tokens, vocab_size=self.tokenizer.vocab_size,
                       on_tokens=show if on_text else None)
        ids = np.asarray(out.tokens)[0, :np.asarray(out.lengths)[0]].tolist()  # on the host: no eager op to compile
        if ids and ids[-1] in self.stop_tokens:
            ids.pop()
        if on_text:
            rest = stream.close()
            if rest:
                on_text(rest)
        reply = self.tokenizer.decode(ids)
        self.messages += [{"role": "user", "content": message}, {"role": "assistant", "content": reply}]
        self.turns += 1
        return Reply(reply, ids)

