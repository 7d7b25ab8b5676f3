"""ConfigError: one line naming the key that is wrong and how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration mistake, reported to the user in one line (no traceback)."""


# The names other frameworks give a hyperparameter (transformers' configs and TrainingArguments,
# nanoGPT, peft, optax), each to the last part of theseus's key for it: what a user may type first.
ALIASES = {
    **dict.fromkeys(("learning_rate", "lr_rate"), "lr"),
    **dict.fromkeys(("num_layers", "n_layer", "num_hidden_layers", "depth"), "n_layers"),
    **dict.fromkeys(("hidden_size", "n_embd", "embed_dim", "d_embed", "dim"), "d_model"),
    **dict.fromkeys(("num_heads", "n_head", "num_attention_heads"), "n_heads"),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_head"), "n_kv_heads"),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "ff_dim", "d_ffn", "mlp_dim"), "d_ff"),
    **dict.fromkeys(("block_size", "context_length", "max_seq_len", "max_position_embeddings", "n_ctx",
                     "n_positions", "seq_length"), "seq_len"),
    **dict.fromkeys(("steps", "num_steps", "max_iters", "total_steps", "train_steps"), "max_steps"),
    **dict.fromkeys(("train_batch_size", "global_batch_size", "bs"), "batch_size"),
    **dict.fromkeys(("gradient_accumulation_steps", "accumulation_steps", "grad_accum_steps"), "grad_accum"),
    **dict.fromkeys(("warmup", "warmup_iters", "num_warmup_steps"), "warmup_steps"),
    **dict.fromkeys(("beta1", "adam_beta1"), "b1"),
    **dict.fromkeys(("beta2", "adam_beta2"), "b2"),
    **dict.fromkeys(("epsilon", "adam_epsilon"), "eps"),
    **dict.fromkeys(("max_grad_norm", "grad_clip", "clip_grad_norm", "gradient_clipping"), "clip_norm"),
    **dict.fromkeys(("eval_interval", "eval_steps"), "eval_every"),
    **dict.fromkeys(("log_interval", "logging_steps"), "log_every"),
    **dict.fromkeys(("save_steps", "checkpoint_interval"), "checkpoint_every"),
    **dict.fromkeys(("lora_r", "r"), "rank"),
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "target_modules": "targets",
    **dict.fromkeys(("num_experts", "num_local_experts"), "n_experts"),
    "num_experts_per_tok": "top_k",
}


def suggest(key: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known keys closest to a misspelt ``key``, best first.

    The keys whose last part ``key``'s is, or names as another framework does (``ALIASES``),
    come first: under its parent (``optimizer.learning_rate`` -> ``optimizer.lr``), or anywhere
    for a bare name (``lr`` -> ``optimizer.lr``, the larger groups' first). Then keys under the
    same parent with a close leaf (``architecture.scael`` -> ``architecture.scale``; a misspelt
    parent is read as its closest one: ``optimiser.lr`` -> ``optimizer.lr``), then whole keys
    that are very close.
    """
    known = list(known)
    prefix, _, leaf = key.rpartition(".")
    named = ALIASES.get(leaf, leaf)
    size = {group: sum(k.split(".")[0] == group for k in known) for group in {k.split(".")[0] for k in known}}
    found = sorted((k for k in known if k.rpartition(".")[2] == named and k.startswith(f"{prefix}.")
                    or not prefix and k.rpartition(".")[2] == named),  # a bare name: the larger groups' first
                   key=lambda k: (k.count("."), -size[k.split(".")[0]]))
    siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == prefix}
    if not siblings and prefix:  # the group itself misspelt (optimiser.lr): its closest group's keys
        groups = {k.rpartition(".")[0] for k in known}
        for group in difflib.get_close_matches(prefix, list(groups), n=1, cutoff=0.6):
            siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == group}
    for close in [siblings[c] for c in difflib.get_close_matches(leaf, list(siblings), n=n, cutoff=0.6)] + \
            difflib.get_close_matches(key, known, n=n, cutoff=0.8):
        if close not in found:
            found.append(close)
    return found[:n]
