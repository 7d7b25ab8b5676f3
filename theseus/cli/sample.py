"""``python -m theseus.sample PATH [--prompt TEXT | --chat [MESSAGE]]``: continue a prompt, or talk, with a trained model.

PATH is a run directory (its config, its tokenizer and its newest readable checkpoint, or
``--step``), a Hugging Face folder (config.json, safetensors weights, tokenizer.json), a .gguf
file or a model id in the local Hugging Face cache (``theseus.sources``). The
text is printed as it is made. ``--prompt`` continues TEXT for ``--max-new-tokens`` tokens, any
number: past the context, each is drawn from the last ``architecture.seq_len``. ``--chat
MESSAGE`` renders MESSAGE as a user's turn (after ``--system TEXT``, if given) by the chat
template (``--chat-template FILE``, else the model's own: the one its task rendered conversations
with, or its tokenizer's; a model without one is refused) with its generation prompt, and prints
the reply, up to the template's end-of-turn token or the tokenizer's end of text. ``--chat``
alone holds a conversation: on a terminal, a prompt for each message (``/reset`` starts over,
``/exit``, Ctrl-D or Ctrl-C leaves); otherwise each line of standard input is a message and each
reply is printed on its own line. Every turn renders the whole history.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

import jax
import numpy as np

from theseus.base.compilation_cache import use_compilation_cache
from theseus.cli.conversation import Conversation, TextStream
from theseus.cli.trained import load_trained
from theseus.config import ConfigError
from theseus.config.arguments import NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE_INT, PROBABILITY, Parser
from theseus.model.generate import complete
from theseus.model.sampling import Sampling

TALK = object()  # --chat without a message: a conversation
COMMANDS = "/reset starts over, /exit (or Ctrl-D) leaves"


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m theseus.sample", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a theseus run or checkpoint, a Hugging Face folder, a .gguf file or a model id in "
                                     "the local Hugging Face cache")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    group.add_argument("--chat", nargs="?", const=TALK, default=None, metavar="MESSAGE",
                       help="a user's message to reply to, by the chat template; alone: a conversation")
    parser.add_argument("--system", default=None, metavar="TEXT", help="a system message before the chat's first")
    parser.add_argument("--chat-template", default=None, metavar="FILE",
                        help="the chat template to render --chat by (a Jinja file, or a chat model's "
                             "tokenizer_config.json); default: the model's own")
    parser.add_argument("--max-new-tokens", type=POSITIVE_INT, default=200, help="tokens to make (with --chat: a reply's most)")
    parser.add_argument("--temperature", type=NON_NEGATIVE, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=POSITIVE_INT, default=None, help="draw from the K likeliest tokens")
    parser.add_argument("--top-p", type=PROBABILITY, default=None,
                        help="draw from the likeliest tokens whose probability exceeds P (after --top-k)")
    parser.add_argument("--seed", type=NON_NEGATIVE_INT, default=0)
    parser.add_argument("--step", type=NON_NEGATIVE_INT, default=None, help="checkpoint step of a run (default: the newest)")
    args = parser.parse_args(argv)
    for given, flag in ((args.system, "--system"), (args.chat_template, "--chat-template")):
        if given is not None and args.chat is None:
            parser.error(f"{flag} needs --chat")
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    use_compilation_cache()
    try:
        trained = load_trained(args.path, args.step)
        sampling.check(trained.tokenizer.vocab_size)
        if args.chat is None:
            return continue_prompt(trained, args.prompt, args.max_new_tokens, sampling, args.seed)
        chat = Conversation.of(trained, args.chat_template, system=args.system, sampling=sampling,
                               max_new_tokens=args.max_new_tokens, seed=args.seed)
        if args.chat is TALK:
            return converse(chat, sys.stdin, sys.stdout, str(args.path))
        chat.say(args.chat, on_text=_printer(sys.stdout))
        print()
    except (ConfigError, ValueError) as exc:  # a bad argument (ValueError: generation's own checks)
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the line ended, no traceback
        print()
        return 130
    return 0


def continue_prompt(trained, prompt: str, max_new_tokens: int, sampling: Sampling, seed: int) -> int:
    """Print ``prompt`` and its continuation as it is made."""
    tokenizer = trained.tokenizer
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ConfigError("--prompt must hold at least one token")
    stream, show = TextStream(tokenizer), _printer(sys.stdout)
    show(prompt)
    complete(trained.model, trained.params, np.asarray([ids]), [len(ids)], max_new_tokens, sampling,
             keys=jax.random.key(seed)[None], vocab_size=tokenizer.vocab_size,
             on_tokens=lambda tokens: show(stream.add(tokens[0].tolist())))
    show(stream.close() + "\n")
    return 0


def converse(chat: Conversation, stdin: TextIO, stdout: TextIO, name: str) -> int:
    """Hold a conversation: on a terminal, a prompt for each message; otherwise each line of
    ``stdin`` is one. ``/reset`` forgets the turns so far, ``/exit`` or the end of input leaves
    (0); Ctrl-C leaves too (130, as a shell reports SIGINT). Returns the exit code."""
    terminal = stdin.isatty() and stdout.isatty()
    if terminal:
        import readline  # noqa: F401 (input() edits the line and recalls earlier ones)

        print(f"Talking to {name}: {COMMANDS}.", file=sys.stderr)
    show = _printer(stdout)
    try:
        while True:
            line = _read(stdin, terminal)
            if line is None or line.strip() == "/exit":
                return 0
            if line.strip() == "/reset":
                chat.reset()
                if terminal:
                    print("(a new conversation)", file=sys.stderr)
                continue
            if line.strip():
                chat.say(line.rstrip("\n"), on_text=show)
                show("\n")
    except KeyboardInterrupt:
        show("\n")
        return 130


def _read(stdin: TextIO, terminal: bool) -> str | None:
    """The next message, or None at the end of the input."""
    if not terminal:
        return stdin.readline() or None
    try:
        return input("> ")
    except EOFError:
        print()
        return None


def _printer(stdout: TextIO) -> Callable[[str], None]:
    def show(text: str) -> None:
        stdout.write(text)
        stdout.flush()

    return show
