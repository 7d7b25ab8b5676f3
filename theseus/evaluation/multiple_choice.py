"""Multiple-choice evaluation, scored as lm-eval-harness scores HellaSwag or PIQA.

A local JSONL file holds one example a line: ``{"context": str, "choices": [str, ...], "label": int}``.
Each choice is scored by the model's log-likelihood of its tokens given the context, encoded
as lm-eval encodes a request: whitespace ending the context moves into the choice, context and
choice are encoded as one string (with the tokens the tokenizer adds, such as a BOS, unless the
text begins with that BOS's text already) and the choice's tokens are those after the context's
own encoding; a row longer than the window loses its first tokens. ``acc`` picks the choice of highest summed log-likelihood, ``acc_norm`` the
highest per character of the choice, ``acc_bytes`` per UTF-8 byte; each comes with its standard
error. All choices of a batch of examples run as one jitted forward over padded
``[batch, choices, seq]`` tokens with a mask of the choice positions, sharded over the batch
axes like a train step.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from theseus.base.mesh import on_devices
from theseus.config import ConfigError
from theseus.data.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Examples:
    """A multiple-choice file, tokenized and padded (``n`` examples of at most ``choices`` each).

    ``tokens``: int32 ``[n, choices, seq + 1]``, context then choice, right-padded with 0;
    ``mask``: float32 ``[n, choices, seq]``, 1 where the target ``tokens[..., 1:]`` is a choice token;
    ``valid``: bool ``[n, choices]``, False for padding choices; ``labels``: int ``[n]``;
    ``n_chars``, ``n_bytes``: float ``[n, choices]``, each choice's length in characters (acc_norm's
    divisor) and UTF-8 bytes (acc_bytes').
    """

    tokens: np.ndarray
    mask: np.ndarray
    valid: np.ndarray
    labels: np.ndarray
    n_chars: np.ndarray
    n_bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def load_examples(path: str | Path, tokenizer: Tokenizer, seq_len: int) -> Examples:
    """The examples of the JSONL file ``path``; ConfigError ``PATH:LINE: what is wrong`` on bad input.

    A row longer than ``seq_len + 1`` tokens loses its first ones (lm-eval-harness truncates on
    the left too); a choice longer than the window is scored on its last ``seq_len`` tokens.
    """
    path = Path(path).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the multiple-choice file {path}: {exc}") from exc
    rows = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            rows.append(_example(_record(line), f"{path}:{number}", tokenizer))
    if not rows:
        raise ConfigError(f"{path} holds no examples: write one JSON object a line, "
                          '{"context": ..., "choices": [...], "label": N}')
    width = max(len(choices) for _, choices, _ in rows)
    n = len(rows)
    tokens = np.zeros((n, width, seq_len + 1), np.int32)
    mask = np.zeros((n, width, seq_len), np.float32)
    valid = np.zeros((n, width), bool)
    n_chars, n_bytes = np.ones((n, width), np.float64), np.ones((n, width), np.float64)
    labels = np.array([label for *_, label in rows])
    for i, (_, choices, _) in enumerate(rows):
        for c, (context, ids, text) in enumerate(choices):
            row = (context + ids)[-(seq_len + 1):]
            scored = min(len(ids), len(row) - 1)
            tokens[i, c, :len(row)] = row
            mask[i, c, len(row) - 1 - scored:len(row) - 1] = 1
            valid[i, c], n_chars[i, c], n_bytes[i, c] = True, len(text), len(text.encode("utf-8"))
    return Examples(tokens, mask, valid, labels, n_chars, n_bytes)


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text``'s ids as lm-eval-harness's hf model encodes a request's text: with the tokenizer's
    special tokens (a BOS it adds), unless ``text`` begins with the ``prefix_token``'s own text."""
    prefix = tokenizer.prefix_token
    return tokenizer.encode(text, special=prefix is None or not text.startswith(tokenizer.decode([prefix])))


def encode_pair(tokenizer: Tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """``(context ids, continuation ids)`` of a request as lm-eval-harness encodes it: the
    context's trailing whitespace moves into the continuation, the two are encoded as one string
    (``encode_text``), and the continuation is what follows the context's own encoding. An empty
    context is the tokenizer's ``prefix_token`` (its BOS, else end-of-text)."""
    stripped = context.rstrip()
    context, continuation = stripped, context[len(stripped):] + continuation
    if not context:
        prefix = tokenizer.prefix_token
        if prefix is None:
            raise ConfigError("an empty context needs a BOS or end-of-text token, and this tokenizer has neither")
        return [prefix], tokenizer.encode(continuation)
    whole, alone = encode_text(tokenizer, context + continuation), encode_text(tokenizer, context)
    return alone, whole[len(alone):]


def _record(line: str) -> object:
    """The JSON value of ``line``, or None when it is not JSON (reported by ``_example``)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def _example(record, where: str, tokenizer: Tokenizer) -> tuple[str, list, int]:
    """``(context, [(context ids, choice ids, choice)], label)`` of one line; ConfigError naming ``where``."""
    form = '{"context": "...", "choices": ["...", "..."], "label": 0}'
    if not isinstance(record, dict) or not {"context", "choices", "label"} <= set(record):
        raise ConfigError(f"{where}: not an example; each line must be a JSON object {form}")
    context, choices, label = record["context"], record["choices"], record["label"]
    if not isinstance(context, str) or not context:
        raise ConfigError(f"{where}: context must be a non-empty string (the text the choices continue)")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise ConfigError(f"{where}: choices must be a non-empty list of non-empty strings, got {choices!r}")
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(choices):
        raise ConfigError(f"{where}: label must be the index of the right choice, 0 to {len(choices) - 1}, "
                          f"got {label!r}")
    encoded = []
    for choice in choices:
        context_ids, choice_ids = encode_pair(tokenizer, context, choice)
        if not choice_ids:
            raise ConfigError(f"{where}: choice {choice!r} adds no token to the context's: give a longer choice")
        encoded.append((context_ids, choice_ids, choice))
    return context, encoded, label


def log_likelihoods(params, tokens: jax.Array, mask: jax.Array, *, model: nn.Module,
                    vocab_size: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Summed log-likelihood of each choice's tokens, and whether each of them is the model's
    argmax: ``tokens`` int32 ``[batch, choices, seq + 1]``, ``mask`` ``[batch, choices, seq]`` ->
    float32 and bool ``[batch, choices]`` (replicated). ``vocab_size``: the softmax runs over the
    first ``vocab_size`` ids (the model's vocabulary less the padding an export drops; None: all).
    """
    batch, choices, width = tokens.shape
    flat, weights = tokens.reshape(batch * choices, width), mask.reshape(batch * choices, width - 1)
    logits = model.apply({"params": params}, flat[:, :-1], deterministic=True).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits[..., :vocab_size], axis=-1)
    picked = jnp.take_along_axis(logp, flat[:, 1:, None], axis=-1)[..., 0]
    summed = jnp.sum(picked * weights, axis=-1).reshape(batch, choices)
    greedy = jnp.all((logp.argmax(-1) == flat[:, 1:]) | (weights == 0), axis=-1).reshape(batch, choices)
    return jax.lax.with_sharding_constraint((summed, greedy), PartitionSpec())


def correct(scores: np.ndarray, examples: Examples) -> dict[str, np.ndarray]:
    """Per example, whether each metric's pick is the label: ``acc`` (highest summed log-likelihood
    of ``scores`` ``[n, choices]``), ``acc_norm`` (per character), ``acc_bytes`` (per byte); bool ``[n]``."""
    divisors = {"acc": 1.0, "acc_norm": examples.n_chars, "acc_bytes": examples.n_bytes}
    return {name: np.where(examples.valid, scores / divisor, -np.inf).argmax(-1) == examples.labels
            for name, divisor in divisors.items()}


def accuracy(scores: np.ndarray, examples: Examples) -> dict[str, float]:
    """``acc``, ``acc_norm`` and ``acc_bytes`` of ``scores`` ``[n, choices]`` on ``examples``, each
    with its standard error (``acc_stderr``, ...: the sample standard deviation over sqrt(n), as
    lm-eval-harness reports it; omitted for one example)."""
    metrics = {}
    for name, hits in correct(scores, examples).items():
        metrics[name] = float(np.mean(hits))
        if len(hits) > 1:
            metrics[f"{name}_stderr"] = float(np.std(hits, ddof=1) / np.sqrt(len(hits)))
    return metrics


def per_example(scores: np.ndarray, examples: Examples) -> list[dict]:
    """One record per example: its label, each choice's summed log-likelihood and each metric's hit."""
    hits = correct(scores, examples)
    return [{"label": int(examples.labels[i]),
             "scores": [float(x) for x in scores[i][examples.valid[i]]],
             **{name: bool(hit[i]) for name, hit in hits.items()}} for i in range(len(examples))]


def score(params, examples: Examples, score_fn, sharding: NamedSharding, batch_size: int,
          share: tuple[int, int] = (0, 1)) -> np.ndarray:
    """Summed log-likelihoods ``[n, choices]`` of every example, ``batch_size`` examples per call of
    ``score_fn`` (jitted ``log_likelihoods``); ``sharding`` splits ``[batch, choices, seq + 1]`` over
    the batch axes and this process reads share ``index`` of ``count`` of each batch."""
    index, count = share
    n, per = len(examples), batch_size // count
    padded = -(-n // batch_size) * batch_size
    scores = []
    for first in range(0, padded, batch_size):
        mine = np.arange(first + index * per, first + (index + 1) * per) % n  # padding repeats examples
        tokens, mask = (on_devices(part[mine], sharding, (batch_size, *part.shape[1:]))
                        for part in (examples.tokens, examples.mask))
        scores.append(np.asarray(score_fn(params, tokens, mask)[0]))
    return np.concatenate(scores)[:n]
