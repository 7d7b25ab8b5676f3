"""The ``architecture.*`` keys that several classes read, each declared here once.

A layer that reads a shared key declares its field by calling the key's factory, so that the
key's type, default, range, role and help are written once::

    class MLP(Module):
        d_model: int = architecture.d_model()

Each call makes a new dataclass field (a field belongs to one class). A key that one class alone
reads stays a ``field()`` in that class. ``tests/model/test_architecture_keys.py`` checks that no
``architecture.*`` key is declared twice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from theseus.config import FRACTION, NON_NEGATIVE, POSITIVE, RUNTIME, field
from theseus.model.activations import ACTIVATIONS

ATTENTION_IMPLS = ("auto", None, "xla", "cudnn", "splash")
ATTENTION_IMPL_HELP = ("auto: the platform's fused kernel where it pays (a TPU: splash, where the sequence spans "
                       "several of its blocks), else theseus's own; None: "
                       "theseus's own, written out (grouped_attention: the [seq, seq] scores in memory); xla, cudnn: "
                       "jax.nn.dot_product_attention's implementation; splash: Pallas's TPU flash kernel (blocks of "
                       "the sequence, masked ones skipped; interpreted off a TPU), where 128 divides the sequence")
FUSED_DOC = ("fuse q, k and v into one LoRA adapter and gate and up into another, as a Hugging Face model that "
             "stores them fused (Phi-3's qkv_proj, gate_up_proj); None: q, k and v fused with learned positions "
             "(GPT-2's c_attn), nothing fused with rope")
NORM_HELP = "normalisation layer: layernorm, rmsnorm or rmsnorm_offset (Gemma's: gain 1 + w)"


def _key(name: str, default: Any, **declaration: Any) -> Callable[[], Any]:
    """The factory of ``architecture.{name}``'s field: ``field()`` with this one declaration."""
    return functools.partial(field, f"architecture.{name}", default, **declaration)


vocab_size = _key("vocab_size", None, check=POSITIVE, help="vocabulary; None: the tokenizer's")
seq_len = _key("seq_len", 1024, check=POSITIVE, help="context length; data windows use it")
d_model = _key("d_model", 768, check=POSITIVE, help="width of the residual stream")
n_heads = _key("n_heads", 12, check=POSITIVE, help="attention (query) heads")
n_kv_heads = _key("n_kv_heads", None, check=POSITIVE, help="key/value heads; None: n_heads")
head_dim = _key("head_dim", None, check=POSITIVE, help="width of each attention head; None: d_model / n_heads")
d_ff = _key("d_ff", None, check=POSITIVE, help="hidden width of the MLP; None: 4 x d_model")
dropout = _key("dropout", 0.0, check=FRACTION, help="dropout rate (training only)", role=RUNTIME)
bias = _key("bias", True, help="add biases to linear layers and norms")
qkv_bias = _key("qkv_bias", False,
                help="biases on the query, key and value projections even with bias=false (Qwen2)")
norm = _key("norm", "layernorm", help=NORM_HELP)
activation = _key("activation", "gelu", choices=ACTIVATIONS, help="MLP nonlinearity")
positions = _key("positions", "learned", choices=("learned", "rope"), help="position encoding")
rope_theta = _key("rope_theta", 10000.0, check=POSITIVE, help="RoPE base wavelength")
norm_eps = _key("norm_eps", 1e-5, check=POSITIVE, help="epsilon added to the norms' mean square")
sliding_window = _key("sliding_window", None, check=POSITIVE,
                      help="a query sees only itself and the W - 1 positions before it (Mistral, Gemma); "
                           "None: every earlier position")
init_std = _key("init_std", 0.02, check=POSITIVE, help="stddev of the normal initialiser", role=RUNTIME)
attention_impl = _key("attention_impl", "auto", choices=ATTENTION_IMPLS, help=ATTENTION_IMPL_HELP, role=RUNTIME)
fused_projections = _key("fused_projections", None, help=FUSED_DOC, role=RUNTIME)
splash_fused_backward = _key("splash_fused_backward", True, role=RUNTIME,
                             help="splash attention's backward as one kernel (dq with dk and dv: 5 matrix products a "
                                  "(query, key) pair where its two kernels run 7; GPT-2 124M's step on a TPU v5e "
                                  "130.8 ms against 140.7); false: two kernels")
# Bias-balanced routing (DeepSeek-V3): each step, a per-expert selection bias moves by this much
# against the expert's load imbalance (theseus.model.moe); 0: off.
moe_bias_update_rate = _key("moe.bias_update_rate", 0.0, check=NON_NEGATIVE,
                            help="bias-balanced routing's step size (the train step applies it)")
