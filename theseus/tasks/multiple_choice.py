"""Multiple-choice evaluation, scored the way lm-eval-harness scores HellaSwag or PIQA.

A local JSONL file holds one example a line: ``{"context": str, "choices": [str, ...], "label": int}``.
Each choice is scored by the model's log-likelihood of its tokens given the context: ``acc``
picks the choice of highest summed log-likelihood, ``acc_norm`` the highest per UTF-8 byte of
the choice. All choices of a batch of examples run as one jitted forward over padded
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
    ``n_bytes``: float ``[n, choices]``, each choice's UTF-8 length (acc_norm's divisor).
    """

    tokens: np.ndarray
    mask: np.ndarray
    valid: np.ndarray
    labels: np.ndarray
    n_bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def load_examples(path: str | Path, tokenizer: Tokenizer, seq_len: int) -> Examples:
    """The examples of the JSONL file ``path``; ConfigError ``PATH:LINE: what is wrong`` on bad input.

    A context too long for ``seq_len`` loses its first tokens (lm-eval-harness truncates on the
    left too); a choice must fit in ``seq_len`` tokens with at least one context token before it.
    """
    path = Path(path).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the multiple-choice file {path}: {exc}") from exc
    rows = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            rows.append(_example(_record(line), f"{path}:{number}", tokenizer, seq_len))
    if not rows:
        raise ConfigError(f"{path} holds no examples: write one JSON object a line, "
                          '{"context": ..., "choices": [...], "label": N}')
    width = max(len(choices) for _, choices, _ in rows)
    n = len(rows)
    tokens = np.zeros((n, width, seq_len + 1), np.int32)
    mask = np.zeros((n, width, seq_len), np.float32)
    valid = np.zeros((n, width), bool)
    n_bytes = np.ones((n, width), np.float64)
    labels = np.array([label for *_, label in rows])
    for i, (context, choices, _) in enumerate(rows):
        for c, (ids, size) in enumerate(choices):
            row = (context + ids)[-(seq_len + 1):]
            tokens[i, c, :len(row)] = row
            mask[i, c, len(row) - 1 - len(ids):len(row) - 1] = 1
            valid[i, c], n_bytes[i, c] = True, size
    return Examples(tokens, mask, valid, labels, n_bytes)


def _record(line: str) -> object:
    """The JSON value of ``line``, or None when it is not JSON (reported by ``_example``)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def _example(record, where: str, tokenizer: Tokenizer, seq_len: int) -> tuple[list[int], list, int]:
    """``(context ids, [(choice ids, choice bytes)], label)`` of one line; ConfigError naming ``where``."""
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
    encoded = [(tokenizer.encode(choice), len(choice.encode("utf-8"))) for choice in choices]
    longest = max(len(ids) for ids, _ in encoded)
    if longest > seq_len:
        raise ConfigError(f"{where}: a choice of {longest} tokens does not fit architecture.seq_len={seq_len} "
                          "after at least one context token: shorten it")
    return tokenizer.encode(context), encoded, label


def log_likelihoods(params, tokens: jax.Array, mask: jax.Array, *, model: nn.Module) -> jax.Array:
    """Summed log-likelihood of each choice's tokens: ``tokens`` int32 ``[batch, choices, seq + 1]``,
    ``mask`` ``[batch, choices, seq]`` -> float32 ``[batch, choices]`` (replicated)."""
    batch, choices, width = tokens.shape
    flat = tokens.reshape(batch * choices, width)
    logits = model.apply({"params": params}, flat[:, :-1], deterministic=True).astype(jnp.float32)
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), flat[:, 1:, None], axis=-1)[..., 0]
    summed = jnp.sum(picked * mask.reshape(batch * choices, width - 1), axis=-1).reshape(batch, choices)
    return jax.lax.with_sharding_constraint(summed, PartitionSpec())


def accuracy(scores: np.ndarray, examples: Examples) -> dict[str, float]:
    """``acc`` and ``acc_norm`` of ``scores`` ``[n, choices]`` (summed log-likelihoods) on ``examples``."""
    summed = np.where(examples.valid, scores, -np.inf)
    normed = np.where(examples.valid, scores / examples.n_bytes, -np.inf)
    return {"acc": float(np.mean(summed.argmax(-1) == examples.labels)),
            "acc_norm": float(np.mean(normed.argmax(-1) == examples.labels))}


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
        scores.append(np.asarray(score_fn(params, tokens, mask)))
    return np.concatenate(scores)[:n]
