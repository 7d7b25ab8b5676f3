"""Layers: the building blocks of theseus's language models.

Every layer is a theseus Module: its hyperparameters are config fields, its parameters carry
logical axes, and ``flops(seq)`` counts forward + backward FLOPs of one sequence, with a
matmul of an [m, k] by a [k, n] costing 2mkn forward and twice that backward (6 per
parameter per position). Lookups, norms and elementwise ops count as 0.

Shapes: ``x: [batch, seq, d_model]``; ``positions: int32[seq]``, the index of each position
(``int32[batch, seq]`` where rows differ: packed sequences restart at 0); ``segments:
int32[batch, seq] | None``, which packed sequence each position belongs to (None: one per row).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.tree_util import DictKey

from theseus.base.axis import BATCH, EMBED, HEAD_DIM, HEADS, KV_HEADS, MLP_HIDDEN, SEQ, VOCAB
from theseus.base.hardware import check_attention_impl
from theseus.config import ConfigError, configure, field
from theseus.model.lora import LoRA, adapt, adapters, lora_flops
from theseus.model.module import Module, param


def check_vocab_size(vocab_size: int | None) -> None:
    if vocab_size is None:
        raise ConfigError(
            "architecture.vocab_size is not set: set architecture.vocab_size=N "
            "(the trainer takes it from the data's tokenizer)"
        )


def check_heads(d_model: int, n_heads: int, n_kv_heads: int | None, positions: str) -> None:
    """The head layout is consistent: heads split d_model, kv heads split heads, RoPE pairs."""
    if d_model % n_heads:
        raise ConfigError(f"architecture.d_model ({d_model}) must be divisible by architecture.n_heads ({n_heads})")
    if n_kv_heads is not None and n_heads % n_kv_heads:
        raise ConfigError(
            f"architecture.n_heads ({n_heads}) must be divisible by architecture.n_kv_heads ({n_kv_heads})"
        )
    if positions == "rope" and (d_model // n_heads) % 2:
        raise ConfigError(
            f"architecture.positions=rope needs an even head size, but architecture.d_model / "
            f"architecture.n_heads = {d_model // n_heads}"
        )


def check_norm(norm: str, owner: type) -> None:
    """``architecture.norm`` names one of ``owner.norms``."""
    if norm not in owner.norms:
        raise ConfigError(f"architecture.norm must be one of {', '.join(owner.norms)}, got {norm!r} "
                          f"(the keys of {owner.__name__}.norms)")


def leaf_name(path: tuple) -> str:
    """The parameter's own name, as ``param`` gave it: the last dict key of its pytree path
    (past a ``Partitioned`` box)."""
    return next((str(p.key) for p in reversed(path) if isinstance(p, DictKey)), "")


def dense(equation: str, x: jax.Array, w: jax.Array, b: jax.Array | None, dtype: jnp.dtype,
          inputs: jnp.dtype | None = None) -> jax.Array:
    """``einsum(equation, x, w) + b`` computed in ``dtype`` (no bias when ``b`` is None); with
    ``inputs`` another dtype (a module's ``_matmul_dtype``), x and w multiplied in it, the product
    accumulated in float32 and returned in ``dtype``."""
    if inputs is None or jnp.dtype(inputs) == jnp.dtype(dtype):
        y = jnp.einsum(equation, x.astype(dtype), w.astype(dtype))
    else:
        y = jnp.einsum(equation, x.astype(inputs), w.astype(inputs), preferred_element_type=jnp.float32).astype(dtype)
    return y if b is None else y + b.astype(dtype)


class Embedding(Module):
    """Token embedding: ``tokens: int32[batch, seq] -> [batch, seq, d_model]``.

    ``attend`` is the tied output head; its matmul is counted by the model that uses it.
    """

    vocab_size: int | None = field("architecture.vocab_size", default=None, help="vocabulary; None: the tokenizer's")
    d_model: int = field("architecture.d_model", default=768, help="width of the residual stream")
    init_std: float = field("architecture.init_std", default=0.02, help="stddev of the normal initialiser")

    def setup(self):
        check_vocab_size(self.vocab_size)
        init = nn.initializers.normal(self.init_std)
        self.embedding = param(self, "embedding", init, (VOCAB, EMBED), (self.vocab_size, self.d_model))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return jnp.take(self.embedding, tokens, axis=0).astype(self._activation_dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """Logits against the embedding: ``x: [batch, seq, d_model] -> [batch, seq, vocab_size]``."""
        return dense("bsd,vd->bsv", x, self.embedding, None, self._activation_dtype, self._matmul_dtype)


class PositionEmbedding(Module):
    """Learned absolute positions: ``positions: int32[seq] -> [seq, d_model]`` (or ``[batch, seq]`` -> ``[batch, seq, d_model]``)."""

    seq_len: int = field("architecture.seq_len", default=1024, help="context length; data windows use it")
    d_model: int = field("architecture.d_model", default=768, help="width of the residual stream")
    init_std: float = field("architecture.init_std", default=0.02, help="stddev of the normal initialiser")

    def setup(self):
        init = nn.initializers.normal(self.init_std)
        self.embedding = param(self, "embedding", init, (SEQ, EMBED), (self.seq_len, self.d_model))

    def __call__(self, positions: jax.Array) -> jax.Array:
        return jnp.take(self.embedding, positions, axis=0).astype(self._activation_dtype)


class RoPE(Module):
    """Rotary positions (RoFormer; GPT-NeoX/Llama "rotate half" layout).

    Feature pair ``(i, i + head_dim/2)`` of every head turns by ``position * rope_theta **
    (-2i / head_dim)``, so that query-key products depend on relative position only.
    ``x: [batch, seq, heads, head_dim], positions: int32[seq] or [batch, seq] -> x rotated`` (float32 inside).
    """

    rope_theta: float = field("architecture.rope_theta", default=10000.0, help="RoPE base wavelength")

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        half = x.shape[-1] // 2
        inv_freq = self.rope_theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
        angle = positions.astype(jnp.float32)[..., None] * inv_freq  # [(batch,) seq, half]
        cos, sin = jnp.cos(angle)[..., None, :], jnp.sin(angle)[..., None, :]  # [(batch,) seq, 1, half]
        x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def normalize(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """``(x - mean) / sqrt(var + eps) * scale`` over the last axis: ``x: [..., d], scale: [d]``.

    Its gradient is the closed form (as fused LayerNorm kernels compute it) rather than
    autodiff's trace through the mean and the variance: with ``g = dy * scale`` and ``xhat``
    the normalised x, ``dx = (g - mean(g) - xhat * mean(g * xhat)) / sqrt(var + eps)`` and
    ``dscale = sum(dy * xhat)``: two row and one column reduction and a few elementwise
    passes, which halves the norms' backward time in a small GPT's CPU step."""
    return _normalize_forward(x, scale, eps)[0]


def _normalize_forward(x: jax.Array, scale: jax.Array, eps: float) -> tuple[jax.Array, tuple]:
    centred = x - x.mean(-1, keepdims=True)
    inv_std = jax.lax.rsqrt((centred * centred).mean(-1, keepdims=True) + eps)  # [..., 1]
    xhat = centred * inv_std
    return xhat * scale, (xhat, inv_std, scale)


def _normalize_backward(eps: float, residuals: tuple, dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    xhat, inv_std, scale = residuals
    g = dy * scale
    dx = inv_std * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, jnp.sum(dy * xhat, axis=tuple(range(dy.ndim - 1)))


normalize.defvjp(_normalize_forward, _normalize_backward)


class LayerNorm(Module):
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over d_model, in float32 (``normalize``)."""

    d_model: int = field("architecture.d_model", default=768, help="width of the residual stream")
    bias: bool = field("architecture.bias", default=True, help="add biases to linear layers and norms")
    norm_eps: float = field("architecture.norm_eps", default=1e-5, help="epsilon added to the norms' mean square")

    def setup(self):
        self.scale = param(self, "scale", nn.initializers.ones, (EMBED,), (self.d_model,))
        self.offset = param(self, "bias", nn.initializers.zeros, (EMBED,), (self.d_model,)) if self.bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = normalize(x.astype(jnp.float32), self.scale.astype(jnp.float32), self.norm_eps)
        if self.offset is not None:
            y = y + self.offset.astype(jnp.float32)
        return y.astype(self._activation_dtype)


class RMSNorm(Module):
    """``x / sqrt(mean(x^2) + eps) * scale`` over d_model, in float32."""

    d_model: int = field("architecture.d_model", default=768, help="width of the residual stream")
    norm_eps: float = field("architecture.norm_eps", default=1e-5, help="epsilon added to the norms' mean square")

    def setup(self):
        self.scale = param(self, "scale", nn.initializers.ones, (EMBED,), (self.d_model,))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        y = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + self.norm_eps) * self.scale.astype(jnp.float32)
        return y.astype(self._activation_dtype)


NORMS: dict[str, type[Module]] = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


class MLP(Module):
    """Position-wise feed-forward: ``x: [batch, seq, d_model] -> [batch, seq, d_model]``.

    GELU: ``W_out gelu(W_in x)``; SwiGLU: ``W_out (silu(W_gate x) * W_in x)``.
    """

    d_model: int = field("architecture.d_model", default=768, help="width of the residual stream")
    d_ff: int | None = field("architecture.d_ff", default=None, help="hidden width of the MLP; None: 4 x d_model")
    activation: str = field(
        "architecture.activation", default="gelu", choices=("gelu", "swiglu"), help="MLP nonlinearity"
    )
    bias: bool = field("architecture.bias", default=True, help="add biases to linear layers and norms")
    dropout: float = field("architecture.dropout", default=0.0, help="dropout rate (training only)")
    init_std: float = field("architecture.init_std", default=0.02, help="stddev of the normal initialiser")

    @classmethod
    def components(cls) -> list[type]:
        return [LoRA]

    @property
    def hidden(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def n_in(self) -> int:
        """Input projections: 2 for SwiGLU (gate and value), 1 for GELU."""
        return 2 if self.activation == "swiglu" else 1

    def setup(self):
        init, zeros = nn.initializers.normal(self.init_std), nn.initializers.zeros
        self.w_in = param(self, "w_in", init, (None, EMBED, MLP_HIDDEN), (self.n_in, self.d_model, self.hidden))
        self.w_out = param(self, "w_out", init, (MLP_HIDDEN, EMBED), (self.hidden, self.d_model))
        if self.bias:
            self.b_in = param(self, "b_in", zeros, (None, MLP_HIDDEN), (self.n_in, self.hidden))
            self.b_out = param(self, "b_out", zeros, (EMBED,), (self.d_model,))
        into = ((self.d_model,), (EMBED,), (self.hidden,), (MLP_HIDDEN,))  # LoRA's shapes and axes: x -> hidden
        out_of = ((self.hidden,), (MLP_HIDDEN,), (self.d_model,), (EMBED,))  # hidden -> x
        self.lora = adapters({**({"gate": into} if self.n_in == 2 else {}), "up": into, "down": out_of},
                             ("gate", "up", "down"))
        self.drop = nn.Dropout(self.dropout)

    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        dtype = self._activation_dtype
        # one [batch, seq, hidden] product per input projection: an einsum to [n_in, batch, seq,
        # hidden] makes XLA transpose activations and their gradients (a fifth of gpt_small's CPU step)
        h = [dense("bsd,df->bsf", x, self.w_in[i], self.b_in[i] if self.bias else None, dtype, self._matmul_dtype)
             for i in range(self.n_in)]
        h = list(adapt(self.lora, x, dict(zip(("gate", "up")[2 - self.n_in:], h, strict=True)), deterministic))
        h = jax.nn.silu(h[0]) * h[1] if self.activation == "swiglu" else jax.nn.gelu(h[0], approximate=True)
        h = nn.with_logical_constraint(h, (BATCH, SEQ, MLP_HIDDEN))
        y = dense("bsf,fd->bsd", h, self.w_out, self.b_out if self.bias else None, dtype, self._matmul_dtype)
        (y,) = adapt(self.lora, h, {"down": y}, deterministic)
        return self.drop(y, deterministic=deterministic)

    def flops(self, seq: int) -> int:
        """The input and output projections and their adapters."""
        return self.dense_flops("w_in", seq) + self.dense_flops("w_out", seq) + lora_flops(self.lora, seq)


class KVCache(Module):
    """Keys and values of the positions seen so far, for decoding a chunk at a time.

    Its variables (collection ``cache``) are ``[batch, max_len, kv_heads, head_dim]``, sized by
    the call that creates them (``theseus.model.generate`` creates them at prompt + new tokens).
    """

    @nn.compact
    def __call__(self, k: jax.Array, v: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Write ``k, v: [batch, seq, kv_heads, head_dim]`` at ``positions``; return every cached
        key and value and the causal mask ``bool[seq, max_len]`` of the queries at ``positions``."""
        keys = self.variable("cache", "key", jnp.zeros, k.shape, k.dtype)
        values = self.variable("cache", "value", jnp.zeros, v.shape, v.dtype)
        keys.value = jax.lax.dynamic_update_slice_in_dim(keys.value, k, positions[0], axis=1)
        values.value = jax.lax.dynamic_update_slice_in_dim(values.value, v, positions[0], axis=1)
        mask = positions[:, None] >= jnp.arange(keys.value.shape[1])
        return keys.value, values.value, mask


class Attention(Module):
    """Causal self-attention, multi-head or grouped-query: ``x: [batch, seq, d_model] -> same``.

    ``n_heads`` query heads share ``n_kv_heads`` key/value heads (MHA when equal, MQA at 1),
    through ``jax.nn.dot_product_attention`` (``attention_impl=cudnn``: cuDNN flash attention).
    Dropout applies to the output (the fused kernels have none on the probabilities). With
    ``decode``, keys and values go through a KVCache and queries see every cached position up
    to their own. With ``segments``, a query sees only the earlier keys of its own segment
    (packed sequences stay apart).
    """

    d_model: int = field("architecture.d_model", default=768, help="width of the residual stream")
    n_heads: int = field("architecture.n_heads", default=12, help="attention (query) heads")
    n_kv_heads: int | None = field("architecture.n_kv_heads", default=None, help="key/value heads; None: n_heads")
    bias: bool = field("architecture.bias", default=True, help="add biases to linear layers and norms")
    qkv_bias: bool = field("architecture.qkv_bias", default=False,
                           help="biases on the query, key and value projections even with bias=false (Qwen2)")
    dropout: float = field("architecture.dropout", default=0.0, help="dropout rate (training only)")
    init_std: float = field("architecture.init_std", default=0.02, help="stddev of the normal initialiser")
    positions: str = field(
        "architecture.positions", default="learned", choices=("learned", "rope"), help="position encoding"
    )
    attention_impl: str | None = field(
        "architecture.attention_impl", default=None, choices=(None, "xla", "cudnn"),
        help="jax.nn.dot_product_attention implementation; None: JAX chooses",
    )
    decode: bool = False  # not a config key: attend through a KVCache (generation)

    def __post_init__(self):
        check_heads(self.d_model, self.n_heads, self.n_kv_heads, self.positions)
        super().__post_init__()
        check_attention_impl(self.attention_impl, self._activation_dtype)

    @classmethod
    def components(cls) -> list[type]:
        return [RoPE, KVCache, LoRA]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    def setup(self):
        d, h, kv, hd = self.d_model, self.n_heads, self.kv_heads, self.head_dim
        init, zeros = nn.initializers.normal(self.init_std), nn.initializers.zeros
        self.wq = param(self, "wq", init, (EMBED, HEADS, HEAD_DIM), (d, h, hd))
        self.wk = param(self, "wk", init, (EMBED, KV_HEADS, HEAD_DIM), (d, kv, hd))
        self.wv = param(self, "wv", init, (EMBED, KV_HEADS, HEAD_DIM), (d, kv, hd))
        self.wo = param(self, "wo", init, (HEADS, HEAD_DIM, EMBED), (h, hd, d))
        qkv_bias = self.bias or self.qkv_bias
        self.bq = param(self, "bq", zeros, (HEADS, HEAD_DIM), (h, hd)) if qkv_bias else None
        self.bk = param(self, "bk", zeros, (KV_HEADS, HEAD_DIM), (kv, hd)) if qkv_bias else None
        self.bv = param(self, "bv", zeros, (KV_HEADS, HEAD_DIM), (kv, hd)) if qkv_bias else None
        self.bo = param(self, "bo", zeros, (EMBED,), (d,)) if self.bias else None
        into = ((d,), (EMBED,))  # LoRA; learned positions (GPT-2's layout) fuse q, k and v as GPT-2's c_attn does
        self.lora = adapters({"q": (*into, (h, hd), (HEADS, HEAD_DIM)), "k": (*into, (kv, hd), (KV_HEADS, HEAD_DIM)),
                              "v": (*into, (kv, hd), (KV_HEADS, HEAD_DIM)),
                              "o": ((h, hd), (HEADS, HEAD_DIM), (d,), (EMBED,))},
                             ("q", "k", "v", "o"), fuse=self.positions == "learned")
        self.rope = configure(RoPE) if self.positions == "rope" else None
        self.cache = configure(KVCache) if self.decode else None
        self.drop = nn.Dropout(self.dropout)

    def __call__(self, x: jax.Array, positions: jax.Array, deterministic: bool = True,
                 segments: jax.Array | None = None) -> jax.Array:
        dtype = self._activation_dtype
        q = dense("bsd,dnh->bsnh", x, self.wq, self.bq, dtype, self._matmul_dtype)  # [batch, seq, heads, head_dim]
        k = dense("bsd,dnh->bsnh", x, self.wk, self.bk, dtype, self._matmul_dtype)  # [batch, seq, kv_heads, head_dim]
        v = dense("bsd,dnh->bsnh", x, self.wv, self.bv, dtype, self._matmul_dtype)
        q, k, v = adapt(self.lora, x, {"q": q, "k": k, "v": v}, deterministic)
        q = nn.with_logical_constraint(q, (BATCH, SEQ, HEADS, HEAD_DIM))
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        if self.cache is None:
            same = None if segments is None else (segments[:, None, :, None] == segments[:, None, None, :])
            out = jax.nn.dot_product_attention(q, k, v, mask=same, is_causal=True, implementation=self.attention_impl)
        else:  # a masked step over the cache: XLA's kernel (the flash kernels want whole sequences)
            k, v, mask = self.cache(k, v, positions)
            out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
        y = dense("bsnh,nhd->bsd", out, self.wo, self.bo, dtype, self._matmul_dtype)
        (y,) = adapt(self.lora, out, {"o": y}, deterministic)
        return self.drop(y, deterministic=deterministic)

    def flops(self, seq: int) -> int:
        """Projections (q, o: d_model x d_model; k, v: d_model x kv width) and their adapters,
        then scores and values: 2 x 2 x seq^2 x d_model forward, x 3 with backward, in full (not
        causal-halved)."""
        projections = sum(self.dense_flops(name, seq) for name in ("wq", "wk", "wv", "wo"))
        return projections + lora_flops(self.lora, seq) + 12 * self.n_heads * self.head_dim * seq**2


class Block(Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``+ mlp(norm(x))``; x: [batch, seq, d_model].

    Its children are class attributes that a subclass overrides (``mlp_cls = MyMLP``);
    ``components()`` follows them. ``norms`` maps each ``architecture.norm`` choice to its class.
    """

    attention_cls: ClassVar[type[Module]] = Attention
    mlp_cls: ClassVar[type[Module]] = MLP
    norms: ClassVar[Mapping[str, type[Module]]] = NORMS

    norm: str = field("architecture.norm", default="layernorm", help="normalisation layer: layernorm or rmsnorm")
    decode: bool = False  # not a config key: attend through a KVCache (generation)

    def __post_init__(self):
        check_norm(self.norm, type(self))
        super().__post_init__()

    @classmethod
    def components(cls) -> list[type]:
        return [*cls.norms.values(), cls.attention_cls, cls.mlp_cls]

    def setup(self):
        norm = self.norms[self.norm]
        self.ln_1 = configure(norm)
        self.attn = configure(self.attention_cls, decode=self.decode)
        self.ln_2 = configure(norm)
        self.mlp = configure(self.mlp_cls)

    def __call__(self, x: jax.Array, positions: jax.Array, deterministic: bool = True,
                 segments: jax.Array | None = None) -> jax.Array:
        x = x + self.attn(self.ln_1(x), positions, deterministic, segments)
        x = x + self.mlp(self.ln_2(x), deterministic)
        return nn.with_logical_constraint(x, (BATCH, SEQ, EMBED))

    def flops(self, seq: int) -> int:
        """Attention + MLP (the norms do no matmuls)."""
        return self.attn.flops(seq) + self.mlp.flops(seq)
