"""``python -m theseus.sample PATH [--prompt TEXT]``: continue a prompt with a trained model.

PATH is a run directory (its config, its tokenizer and its newest readable checkpoint, or
``--step``) or a Hugging Face folder (config.json, safetensors weights, tokenizer.json). Any
number of tokens: past the context, each is drawn from the last ``architecture.seq_len``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax

from theseus.config import ConfigError
from theseus.config.arguments import NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE_INT, Parser
from theseus.model.generate import sample_text
from theseus.training.checkpoint import require_checkpoint
from theseus.training.trained import load_trained


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m theseus.sample", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="a run directory or a Hugging Face folder")
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    parser.add_argument("--max-new-tokens", type=POSITIVE_INT, default=200)
    parser.add_argument("--temperature", type=NON_NEGATIVE, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=POSITIVE_INT, default=None)
    parser.add_argument("--seed", type=NON_NEGATIVE_INT, default=0)
    parser.add_argument("--step", type=NON_NEGATIVE_INT, default=None, help="checkpoint step of a run (default: the newest)")
    args = parser.parse_args(argv)
    try:
        require_checkpoint(args.path)
        trained = load_trained(args.path, args.step)
        tokenizer = trained.tokenizer
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


if __name__ == "__main__":
    sys.exit(main())
