"""``python -m theseus.sample PATH [--prompt TEXT | --chat MESSAGE]``: continue a prompt with a trained model.

PATH is a run directory (its config, its tokenizer and its newest readable checkpoint, or
``--step``) or a Hugging Face folder (config.json, safetensors weights, tokenizer.json). Any
number of tokens: past the context, each is drawn from the last ``architecture.seq_len``.
``--chat`` renders MESSAGE as a user's turn by the chat template (``data.chat_template``, the
tokenizer's, or theseus's default for byte) with its generation prompt, and prints the reply,
up to the template's end-of-turn token.
"""

from __future__ import annotations

import sys

import jax
import numpy as np

from theseus.config import ConfigError, configuration, configure
from theseus.config.arguments import NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE_INT, Parser
from theseus.data.chat import ChatTemplate, chat_prompt
from theseus.data.config import DataConfig
from theseus.model.generate import generate, sample_text
from theseus.trained import load_trained


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m theseus.sample", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a theseus run or checkpoint, a Hugging Face folder, a .gguf file or a model id in "
                                     "the local Hugging Face cache")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    group.add_argument("--chat", default=None, metavar="MESSAGE", help="a user's message to reply to, by the chat template")
    parser.add_argument("--max-new-tokens", type=POSITIVE_INT, default=200)
    parser.add_argument("--temperature", type=NON_NEGATIVE, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=POSITIVE_INT, default=None)
    parser.add_argument("--seed", type=NON_NEGATIVE_INT, default=0)
    parser.add_argument("--step", type=NON_NEGATIVE_INT, default=None, help="checkpoint step of a run (default: the newest)")
    args = parser.parse_args(argv)
    try:
        trained = load_trained(args.path, args.step)
        tokenizer = trained.tokenizer
        if args.chat is not None:
            print(reply(trained, args.chat, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                        rng=jax.random.key(args.seed)))
            return 0
        if not tokenizer.encode(args.prompt):
            raise ConfigError("--prompt must hold at least one token")
        text = sample_text(trained.model, trained.params, args.prompt, tokenizer.encode, tokenizer.decode,
                           args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                           rng=jax.random.key(args.seed), vocab_size=tokenizer.vocab_size)
    except (ConfigError, ValueError) as exc:  # a bad argument (ValueError: generate's own checks)
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    print(args.prompt + text)
    return 0


def reply(trained, message: str, max_new_tokens: int, **kwargs) -> str:
    """The model's reply to a user's ``message``, rendered by the run's chat template (kwargs:
    generate's temperature, top_k, rng): the text before the end-of-turn token, or all of it."""
    with configuration(trained.cfg):
        data = configure(DataConfig)
    template = ChatTemplate.find(data.tokenizer, data.chat_template)
    tokenizer = trained.tokenizer
    prompt = chat_prompt(template, tokenizer, message)
    tokens = generate(trained.model, trained.params, prompt[None], max_new_tokens, vocab_size=tokenizer.vocab_size,
                      **kwargs)
    new = np.asarray(tokens[0, len(prompt):])
    ends = np.flatnonzero(new == template.end_of_turn(tokenizer))
    return tokenizer.decode(new[: ends[0] if ends.size else len(new)].tolist())


if __name__ == "__main__":
    sys.exit(main())
