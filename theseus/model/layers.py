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
import inspect
import math
import string
from collections.abc import Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.tree_util import DictKey

from theseus.base.axis import BATCH, EMBED, HEAD_DIM, HEADS, KV_HEADS, MLP_HIDDEN, SEQ, VOCAB
from theseus.base.hardware import backend, check_attention_impl
from theseus.config import POSITIVE, ConfigError, configure, field
from theseus.model import architecture
from theseus.model.activations import activate, input_projections
from theseus.model.lora import GATE_UP, QKV, LoRA, adapt, adapters, lora_flops
from theseus.model.module import Module, param
from theseus.model.splash import block_size, computed_pairs, skips_blocks, splash_attention


def check_vocab_size(vocab_size: int | None) -> None:
    if vocab_size is None:
        raise ConfigError(
            "architecture.vocab_size is not set: set architecture.vocab_size=N "
            "(the trainer takes it from the data's tokenizer)"
        )


def check_heads(d_model: int, n_heads: int, n_kv_heads: int | None, positions: str,
                head_dim: int | None = None) -> None:
    """The head layout is consistent: heads split d_model (unless ``head_dim`` sets their width),
    kv heads split heads, RoPE pairs."""
    if head_dim is None and d_model % n_heads:
        raise ConfigError(f"architecture.d_model ({d_model}) must be divisible by architecture.n_heads ({n_heads}), "
                          f"or set architecture.head_dim")
    if n_kv_heads is not None and n_heads % n_kv_heads:
        raise ConfigError(
            f"architecture.n_heads ({n_heads}) must be divisible by architecture.n_kv_heads ({n_kv_heads})"
        )
    width = head_dim or d_model // n_heads
    if positions == "rope" and width % 2:
        raise ConfigError(
            f"architecture.positions=rope needs an even head size, but "
            f"{'architecture.head_dim' if head_dim else 'architecture.d_model / architecture.n_heads'} = {width}"
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
    y = checkpoint_name(weight_product(equation, *operands(x, w, dtype, inputs)).astype(dtype), WEIGHT_PRODUCT)
    return y if b is None else y + b.astype(dtype)


def operands(x: jax.Array, w: jax.Array, dtype: jnp.dtype, inputs: jnp.dtype | None) -> tuple:
    """``(x, w, accumulate)`` as ``dense`` multiplies them: in ``dtype``, or in ``inputs`` where it
    differs, summed in float32 (``accumulate``; None: in the inputs' dtype)."""
    if inputs is None or jnp.dtype(inputs) == jnp.dtype(dtype):
        return x.astype(dtype), w.astype(dtype), None
    return x.astype(inputs), w.astype(inputs), jnp.float32


ATTENTION_SCORES = "attention_scores"  # the name scope of scores, softmax and values (dry run: traffic rows)
WEIGHT_PRODUCT = "weight_product"  # every dense's product: what remat=dots keeps (a custom_vjp hides its dot)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def weight_product(equation: str, x: jax.Array, w: jax.Array, accumulate: jnp.dtype | None = None) -> jax.Array:
    """``einsum(equation, x, w)`` (accumulated in ``accumulate``, default x's dtype), whose backward
    pass computes both gradients as einsums of their own. Differentiating the einsum instead leaves
    XLA's CPU backend a weight gradient contracting over the leading (token) axes, which it feeds to
    its matrix-product kernels through a transposed copy of the activations' gradient: 0.15 of a
    SwiGLU MLP's step (XLA's GPU and TPU backends compile both forms alike). Each of the three
    products contracts its summed axes merged into one (``contract``)."""
    return contract(*_operand_axes(equation), x, w, accumulate)


def _weight_product_forward(equation, x, w, accumulate):
    return weight_product(equation, x, w, accumulate), (x, w)


def _weight_product_backward(equation, accumulate, residuals, dy):
    x, w = residuals
    x_axes, w_axes, out = _operand_axes(equation)
    dy = dy.astype(x.dtype)
    dx = contract(out, w_axes, x_axes, dy, w, accumulate)  # sums w's output axes (heads, head_dim)
    dw = contract(x_axes, out, w_axes, x, dy, accumulate)  # sums the tokens' axes (batch, seq)
    return dx.astype(x.dtype), dw.astype(w.dtype)


def contract(a_axes: str, b_axes: str, out: str, a: jax.Array, b: jax.Array,
             accumulate: jnp.dtype | None = None) -> jax.Array:
    """``einsum(f"{a_axes},{b_axes}->{out}", a, b)`` as a matrix product: the axes it sums over,
    and each operand's own axes, merged into one where they lie adjacent and in the same order
    wherever they appear. XLA's CPU backend multiplies such a product in place. Given several
    summed axes, it copies both operands transposed first, in the order jnp.einsum gives them
    (alphabetical, not the arrays'): attention's input gradients, summed over (heads, head_dim),
    spent more time in those copies than in their products; given several axes of an operand's
    own, it has no bfloat16 kernel accumulating in float32."""
    sizes = dict(zip(a_axes + b_axes, a.shape + b.shape, strict=True))
    shape = tuple(sizes[axis] for axis in out)
    spare = (letter for letter in string.ascii_letters if letter not in a_axes + b_axes + out)  # new axes' names
    runs = ("".join(axis for axis in a_axes if axis in b_axes and axis not in out),  # summed over
            "".join(axis for axis in a_axes if axis in out and axis not in b_axes),  # a's own
            "".join(axis for axis in b_axes if axis in out and axis not in a_axes))  # b's own
    for run in runs:
        holders = [axes for axes in (a_axes, b_axes, out) if run[:1] in axes]
        if len(run) > 1 and all(run in axes for axes in holders):
            letter = next(spare)
            if run in a_axes:
                a, a_axes = _merged(a, a_axes, run), a_axes.replace(run, letter)
            if run in b_axes:
                b, b_axes = _merged(b, b_axes, run), b_axes.replace(run, letter)
            out = out.replace(run, letter)
    return jnp.einsum(f"{a_axes},{b_axes}->{out}", a, b, preferred_element_type=accumulate).reshape(shape)


def _merged(a: jax.Array, axes: str, run: str) -> jax.Array:
    """``a`` with its axes ``run`` (adjacent in ``axes``) reshaped into one."""
    start = axes.index(run)
    return a.reshape(*a.shape[:start], -1, *a.shape[start + len(run):])


def _operand_axes(equation: str) -> tuple[str, str, str]:
    """``"bsd,df->bsf"`` -> ``("bsd", "df", "bsf")``: x's, w's and the product's axes."""
    ins, out = equation.split("->")
    return (*ins.split(","), out)


weight_product.defvjp(_weight_product_forward, _weight_product_backward)


class Embedding(Module):
    """Token embedding: ``tokens: int32[batch, seq] -> [batch, seq, d_model]``, times sqrt(d_model)
    with ``scale_embeddings`` (Gemma's).

    ``attend`` is the tied output head (unscaled); its matmul is counted by the model that uses it.
    """

    vocab_size: int | None = architecture.vocab_size()
    d_model: int = architecture.d_model()
    init_std: float = architecture.init_std()
    scale_embeddings: bool = field("architecture.scale_embeddings", default=False,
                                   help="multiply the token embeddings by sqrt(d_model) (Gemma)")

    def setup(self):
        check_vocab_size(self.vocab_size)
        init = nn.initializers.normal(self.init_std)
        self.embedding = param(self, "embedding", init, (VOCAB, EMBED), (self.vocab_size, self.d_model))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = jnp.take(self.embedding, tokens, axis=0).astype(self._activation_dtype)
        return x * jnp.asarray(math.sqrt(self.d_model), x.dtype) if self.scale_embeddings else x

    def attend(self, x: jax.Array) -> jax.Array:
        """Logits against the embedding: ``x: [batch, seq, d_model] -> [batch, seq, vocab_size]``."""
        return dense("bsd,vd->bsv", x, self.embedding, None, self._activation_dtype, self._matmul_dtype)


class PositionEmbedding(Module):
    """Learned absolute positions: ``positions: int32[seq] -> [seq, d_model]`` (or ``[batch, seq]`` -> ``[batch, seq, d_model]``)."""

    seq_len: int = architecture.seq_len()
    d_model: int = architecture.d_model()
    init_std: float = architecture.init_std()

    def setup(self):
        init = nn.initializers.normal(self.init_std)
        self.embedding = param(self, "embedding", init, (SEQ, EMBED), (self.seq_len, self.d_model))

    def __call__(self, positions: jax.Array) -> jax.Array:
        return jnp.take(self.embedding, positions, axis=0).astype(self._activation_dtype)


ROPE_SCALINGS = ("none", "linear", "llama3")


class RoPE(Module):
    """Rotary positions (RoFormer; GPT-NeoX/Llama "rotate half" layout).

    Feature pair ``(i, i + head_dim/2)`` of every head turns by ``position * inv_freq[i]``, with
    ``inv_freq[i] = rope_theta ** (-2i / head_dim)``, so that query-key products depend on
    relative position only. ``rope_scaling.type`` stretches the wavelengths for a longer context
    than pretrained: ``linear`` divides every frequency by ``factor``; ``llama3`` (Llama 3.1's)
    divides those of wavelength above ``original_seq_len / low_freq_factor``, keeps those below
    ``original_seq_len / high_freq_factor`` and interpolates between (as transformers'
    ``_compute_llama3_parameters``).
    ``x: [batch, seq, heads, head_dim], positions: int32[seq] or [batch, seq] -> x rotated`` (float32 inside;
    positions below ``seq_len``, the context, as every caller of theseus's has them; a position beyond
    it is rotated by NaN, ``jnp.take``'s fill).
    """

    rope_theta: float = architecture.rope_theta()
    scaling: str = field("architecture.rope_scaling.type", default="none", choices=ROPE_SCALINGS,
                         help="RoPE frequency scaling for a context longer than pretrained: none, linear, llama3")
    factor: float = field("architecture.rope_scaling.factor", default=8.0, check=POSITIVE,
                          help="RoPE scaling (linear, llama3): how many times longer the context")
    low_freq_factor: float = field("architecture.rope_scaling.low_freq_factor", default=1.0, check=POSITIVE,
                                   help="llama3 RoPE scaling: wavelengths above original_seq_len / this are scaled")
    high_freq_factor: float = field("architecture.rope_scaling.high_freq_factor", default=4.0, check=POSITIVE,
                                    help="llama3 RoPE scaling: wavelengths below original_seq_len / this are kept")
    original_seq_len: int = field("architecture.rope_scaling.original_seq_len", default=8192, check=POSITIVE,
                                  help="llama3 RoPE scaling: the context pretrained (original_max_position_embeddings)")
    seq_len: int = architecture.seq_len()

    def __post_init__(self):
        super().__post_init__()
        if self.scaling == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ConfigError(f"architecture.rope_scaling.high_freq_factor ({self.high_freq_factor}) must exceed "
                              f"architecture.rope_scaling.low_freq_factor ({self.low_freq_factor})")

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """``float32[head_dim / 2]``: each feature pair's angle per position."""
        half = head_dim // 2
        inv_freq = np.float32(self.rope_theta) ** (-np.arange(half, dtype=np.float32) / np.float32(half))
        if self.scaling == "linear":
            return inv_freq / np.float32(self.factor)
        if self.scaling == "llama3":
            wavelength = 2 * math.pi / inv_freq
            scaled = np.where(wavelength > self.original_seq_len / self.low_freq_factor, inv_freq / self.factor,
                              inv_freq)
            smooth = ((self.original_seq_len / wavelength - self.low_freq_factor)
                      / (self.high_freq_factor - self.low_freq_factor))
            medium = ((wavelength >= self.original_seq_len / self.high_freq_factor)
                      & (wavelength <= self.original_seq_len / self.low_freq_factor))
            return np.where(medium, (1 - smooth) * scaled / self.factor + smooth * scaled, scaled).astype(np.float32)
        return inv_freq

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        cos, sin = (jnp.take(table, positions, axis=0)[..., None, :]  # [(batch,) seq, 1, half]
                    for table in rotary_tables(tuple(self.inv_freq(x.shape[-1]).tolist()), self.seq_len))
        x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


@functools.cache
def rotary_tables(inv_freq: tuple[float, ...], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin: float32[seq_len, half]`` of ``position * inv_freq`` (the angle a float32 product,
    as transformers computes it), made once on the host: the program reads them as constants.
    Computed in the program instead, XLA's CPU backend fused ``cos`` and ``sin`` into each
    consumer and evaluated them once per element of ``[batch, seq, heads, half]``, not per
    position (RoPE and its gradient in a SmolLM2-135M LoRA step: 98 ms a device, 18 ms read from
    the tables)."""
    angle = np.arange(seq_len, dtype=np.float32)[:, None] * np.asarray(inv_freq, np.float32)
    return np.cos(angle, dtype=np.float64).astype(np.float32), np.sin(angle, dtype=np.float64).astype(np.float32)


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
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over the last axis (d_model), in float32 (``normalize``)."""

    d_model: int = architecture.d_model()
    bias: bool = architecture.bias()
    norm_eps: float = architecture.norm_eps()
    axis: str = EMBED  # not a config key: the logical axis of the normalised features (HEAD_DIM: a q/k norm)

    def setup(self):
        self.scale = param(self, "scale", nn.initializers.ones, (self.axis,), (self.d_model,))
        self.offset = param(self, "bias", nn.initializers.zeros, (self.axis,), (self.d_model,)) if self.bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = normalize(x.astype(jnp.float32), self.scale.astype(jnp.float32), self.norm_eps)
        if self.offset is not None:
            y = y + self.offset.astype(jnp.float32)
        return y.astype(self._activation_dtype)


class RMSNorm(Module):
    """``x / sqrt(mean(x^2) + eps) * gain`` over the last axis (d_model), in float32; the gain is
    ``scale`` (``1 + scale`` in ``OffsetRMSNorm``)."""

    d_model: int = architecture.d_model()
    norm_eps: float = architecture.norm_eps()
    axis: str = EMBED  # not a config key: the logical axis of the normalised features (HEAD_DIM: a q/k norm)
    gain_offset: ClassVar[float] = 0.0  # the gain is gain_offset + scale

    def setup(self):
        init = nn.initializers.zeros if self.gain_offset else nn.initializers.ones  # a gain of 1
        self.scale = param(self, "scale", init, (self.axis,), (self.d_model,))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        gain = self.scale.astype(jnp.float32)
        gain = gain + self.gain_offset if self.gain_offset else gain
        y = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + self.norm_eps) * gain
        return y.astype(self._activation_dtype)


class OffsetRMSNorm(RMSNorm):
    """RMSNorm whose gain is ``1 + scale`` (Gemma's: ``scale`` starts at 0)."""

    gain_offset: ClassVar[float] = 1.0


NORMS: dict[str, type[Module]] = {"layernorm": LayerNorm, "rmsnorm": RMSNorm, "rmsnorm_offset": OffsetRMSNorm}


def takes(layer: type, argument: str) -> bool:
    """Whether ``layer.__call__`` accepts ``argument`` by keyword (named, or ``**kwargs``)."""
    parameters = inspect.signature(layer.__call__).parameters
    return argument in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def packed(layer: type, segments: jax.Array | None) -> dict[str, jax.Array]:
    """The keyword a call of ``layer`` adds for packed sequences: ``{}`` without them, else
    ``{"segments": segments}``; ConfigError in one line when ``layer`` (a user's subclass written
    before packing) takes none, as its attention would then mix the packed sequences."""
    if segments is None:
        return {}
    if not takes(layer, "segments"):
        raise ConfigError(
            f"{layer.__module__}.{layer.__qualname__}.__call__{inspect.signature(layer.__call__)} takes no "
            f"segments=, which task=sft passes (its conversations packed in windows, each attending to itself): "
            f"add a `segments=None` parameter and pass it on (super().__call__(..., segments=segments))")
    return {"segments": segments}


class MLP(Module):
    """Position-wise feed-forward: ``x: [batch, seq, d_model] -> [batch, seq, d_model]``.

    GELU: ``W_out gelu(W_up x)``; SwiGLU: ``W_out (silu(W_gate x) * W_up x)``; GeGLU: the same
    with a tanh-approximated gelu (Gemma's). Each input projection is a weight of its own
    (``w_gate``, ``w_up``: ``[d_model, hidden]``), as Hugging Face's ``gate_proj`` and ``up_proj``:
    a product each, no slice of a stacked weight to copy (XLA's CPU backend copies one).
    """

    d_model: int = architecture.d_model()
    d_ff: int | None = architecture.d_ff()
    activation: str = architecture.activation()
    bias: bool = architecture.bias()
    dropout: float = architecture.dropout()
    init_std: float = architecture.init_std()
    fused_projections: bool | None = architecture.fused_projections()

    @classmethod
    def components(cls) -> list[type]:
        return [LoRA]

    @property
    def hidden(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def inputs(self) -> tuple[str, ...]:
        """The input projections (``input_projections``): gate and up, or up."""
        return input_projections(self.activation)

    def setup(self):
        init, zeros = nn.initializers.normal(self.init_std), nn.initializers.zeros
        self.w_inputs = {name: param(self, f"w_{name}", init, (EMBED, MLP_HIDDEN), (self.d_model, self.hidden))
                         for name in self.inputs}
        self.w_out = param(self, "w_out", init, (MLP_HIDDEN, EMBED), (self.hidden, self.d_model))
        if self.bias:
            self.b_inputs = {name: param(self, f"b_{name}", zeros, (MLP_HIDDEN,), (self.hidden,))
                             for name in self.inputs}
            self.b_out = param(self, "b_out", zeros, (EMBED,), (self.d_model,))
        into = ((self.d_model,), (EMBED,), (self.hidden,), (MLP_HIDDEN,))  # LoRA's shapes and axes: x -> hidden
        out_of = ((self.hidden,), (MLP_HIDDEN,), (self.d_model,), (EMBED,))  # hidden -> x
        self.lora = adapters({**dict.fromkeys(self.inputs, into), "down": out_of}, ("gate", "up", "down"),
                             fuse=GATE_UP if self.fused_projections and len(self.inputs) == 2 else ())
        self.drop = nn.Dropout(self.dropout)

    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        dtype = self._activation_dtype
        h = {name: dense("bsd,df->bsf", x, w, self.b_inputs[name] if self.bias else None, dtype, self._matmul_dtype)
             for name, w in self.w_inputs.items()}
        h = activate(list(adapt(self.lora, x, h, deterministic)), self.activation)
        h = nn.with_logical_constraint(h, (BATCH, SEQ, MLP_HIDDEN))
        y = dense("bsf,fd->bsd", h, self.w_out, self.b_out if self.bias else None, dtype, self._matmul_dtype)
        (y,) = adapt(self.lora, h, {"down": y}, deterministic)
        return self.drop(y, deterministic=deterministic)

    def flops(self, seq: int) -> int:
        """The input and output projections and their adapters."""
        return (sum(self.dense_flops(f"w_{name}", seq) for name in self.inputs) + self.dense_flops("w_out", seq)
                + lora_flops(self.lora, seq))


def causal_mask(queries: jax.Array, keys: jax.Array, window: int | None) -> jax.Array:
    """``bool[..., q, k]``: which keys each query sees, by position: those at or before it (and,
    with a sliding ``window``, fewer than ``window`` before it: itself and the ``window - 1``
    before). ``queries: int32[..., q]``, ``keys: int32[..., k]``."""
    gap = queries[..., :, None] - keys[..., None, :]
    return (gap >= 0) if window is None else (gap >= 0) & (gap < window)


class KVCache(Module):
    """Keys and values of the positions seen so far, for decoding a chunk at a time.

    Its variables (collection ``cache``) are ``[batch, kv_heads, max_len, head_dim]`` (the
    layout ``grouped_attention``'s products read as they are), sized by the call that creates
    them (``theseus.model.generate`` creates them at its cache length) and laid out over the
    mesh as the batch and the kv heads are (``nn.with_logical_constraint``). A sliding
    ``window`` masks the keys more than ``window - 1`` positions back (they stay cached).
    """

    window: int | None = None  # not a config key: the attention's sliding window

    @nn.compact
    def __call__(self, k: jax.Array, v: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Write ``k, v: [batch, seq, kv_heads, head_dim]`` at ``positions`` (``int32[seq]``, every
        row alike, or ``[batch, seq]``, each row its own, consecutive); return every cached key and
        value and the causal mask ``bool[batch, 1, seq, max_len]`` of the queries there."""
        batch, seq, kv, head_dim = k.shape
        positions = jnp.broadcast_to(positions, (batch, seq))
        rows = jnp.arange(batch)[:, None]
        cached = []
        for name, new in (("key", k), ("value", v)):
            variable = self.variable("cache", name, jnp.zeros, (batch, kv, seq, head_dim), new.dtype)
            # row b at positions[b], in place (no bounds check: the caller sizes the cache)
            written = variable.value.at[rows, :, positions].set(new, mode="promise_in_bounds", unique_indices=True,
                                                                 indices_are_sorted=True)
            variable.value = nn.with_logical_constraint(written, (BATCH, KV_HEADS, None, HEAD_DIM))
            cached.append(variable.value)
        mask = causal_mask(positions, jnp.arange(cached[0].shape[2]), self.window)[:, None]
        return cached[0], cached[1], mask


def grown(cache: Any, length: int) -> Any:
    """A model's ``cache`` collection with every KVCache's keys and values padded with zeros to
    ``length`` positions: the cache a first chunk created at its own length, given room to go on."""
    def grow(path, x):
        if path[-1] not in (DictKey("key"), DictKey("value")):
            return x
        return jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, length - x.shape[-2]), (0, 0)])

    return jax.tree_util.tree_map_with_path(grow, cache)


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                      softcap: float | None = None) -> jax.Array:
    """Queries ``q: [batch, seq, heads, head_dim]`` attending to keys and values laid out as a
    KVCache's, ``k, v: [batch, kv_heads, keys, head_dim]``, where ``mask: bool[batch | 1, 1, seq,
    keys]``; query head n reads kv head n // (heads / kv_heads), as ``jax.nn.dot_product_attention``
    groups them. Scores (times ``scale``, then soft-capped to ``softcap * tanh(scores / softcap)``
    if set: Gemma 2's, which the fused kernels do not compute) and softmax in float32. Written out,
    a kv head's queries as the rows of one product, so that both products read the cache in its
    own layout: nothing larger than the queries is copied at a step (for two rows or more; XLA
    copies a one-row cache, which measures cheaper than a second row). In training too, the
    scores and their gradients stay in the products' own layout, where
    ``jax.nn.dot_product_attention``'s XLA path, batched over the group, copies them transposed."""
    batch, seq, heads, head_dim = q.shape
    kv, length = k.shape[1], k.shape[2]
    group = heads // kv
    rows = q.reshape(batch, seq, kv, group, head_dim).transpose(0, 2, 3, 1, 4).reshape(batch, kv, group * seq, head_dim)
    scores = jnp.einsum("bkqh,bksh->bkqs", rows, k, preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        scores = softcap * jnp.tanh(scores / softcap)
    mask = jnp.broadcast_to(mask[:, :, None], (batch, 1, group, seq, length)).reshape(batch, 1, group * seq, length)
    probs = jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(jnp.float32).min), axis=-1).astype(v.dtype)
    out = jnp.einsum("bkqs,bksh->bkqh", probs, v).reshape(batch, kv, group, seq, head_dim)
    return out.transpose(0, 3, 1, 2, 4).reshape(batch, seq, heads, head_dim)


class Attention(Module):
    """Causal self-attention, multi-head or grouped-query: ``x: [batch, seq, d_model] -> same``.

    ``n_heads`` query heads share ``n_kv_heads`` key/value heads (MHA when equal, MQA at 1), each
    ``head_dim`` wide (d_model / n_heads unless set), by the ``kernel`` ``attention_impl`` names:
    on a TPU by default Pallas's splash kernel (``theseus.model.splash``), else theseus's own
    written out (``grouped_attention``), or ``jax.nn.dot_product_attention``'s implementation
    (``cudnn``: cuDNN flash attention). Dropout applies to the output (the fused kernels have
    none on the probabilities). With ``decode``, keys and values go through a KVCache and queries see every
    cached position up to their own; soft-capped scores (which the fused kernels do not compute)
    are always written out. With ``segments``, a query sees only the earlier keys of its own
    segment (packed sequences stay apart).

    What other families add, each a field at a default that changes nothing: ``qk_norm`` (the
    norm ``architecture.norm`` chooses, over head_dim, on queries and keys before RoPE: Qwen3,
    Gemma 3), ``sliding_window`` (a query sees itself and the ``W - 1`` keys before: Mistral,
    Gemma), ``attn_scale_dim`` (scores scaled by its inverse square root, not head_dim's:
    Gemma's ``query_pre_attn_scalar``), ``attn_softcap`` (scores soft-capped: Gemma 2).
    """

    norms: ClassVar[Mapping[str, type[Module]]] = NORMS

    d_model: int = architecture.d_model()
    n_heads: int = architecture.n_heads()
    n_kv_heads: int | None = architecture.n_kv_heads()
    d_head: int | None = architecture.head_dim()
    bias: bool = architecture.bias()
    qkv_bias: bool = architecture.qkv_bias()
    dropout: float = architecture.dropout()
    init_std: float = architecture.init_std()
    positions: str = architecture.positions()
    norm: str = architecture.norm()
    qk_norm: bool = field("architecture.qk_norm", default=False,
                          help="normalise each head's queries and keys (the architecture.norm layer over head_dim) "
                               "before RoPE (Qwen3, Gemma 3)")
    sliding_window: int | None = architecture.sliding_window()
    attn_scale_dim: int | None = field("architecture.attn_scale_dim", default=None, check=POSITIVE,
                                       help="scores are scaled by attn_scale_dim ** -0.5 (Gemma's "
                                            "query_pre_attn_scalar); None: head_dim")
    attn_softcap: float | None = field("architecture.attn_softcap", default=None, check=POSITIVE,
                                       help="soft-cap attention scores to (-c, c) by c * tanh(score / c) (Gemma 2); "
                                            "None: no cap")
    attention_impl: str | None = architecture.attention_impl()
    splash_fused_backward: bool = architecture.splash_fused_backward()
    fused_projections: bool | None = architecture.fused_projections()
    decode: bool = False  # not a config key: attend through a KVCache (generation)

    def __post_init__(self):
        super().__post_init__()  # each field within its declared range
        check_heads(self.d_model, self.n_heads, self.n_kv_heads, self.positions, self.d_head)
        if self.qk_norm:
            check_norm(self.norm, type(self))
        if self.attn_softcap is not None and self.attention_impl == "cudnn":
            raise ConfigError("architecture.attn_softcap soft-caps the attention scores, which cuDNN's kernel does "
                              "not compute: set architecture.attention_impl=xla (or null)")
        check_attention_impl(self.attention_impl, self._activation_dtype)

    @classmethod
    def components(cls) -> list[type]:
        return [RoPE, KVCache, LoRA, *cls.norms.values()]

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def scale(self) -> float:
        """What query-key products are multiplied by (as jax's default computes 1 / sqrt(head_dim))."""
        return 1.0 / math.sqrt(self.attn_scale_dim or self.head_dim)

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
        norm = self.norms[self.norm]
        self.q_norm = configure(norm, d_model=hd, axis=HEAD_DIM) if self.qk_norm else None
        self.k_norm = configure(norm, d_model=hd, axis=HEAD_DIM) if self.qk_norm else None
        into = ((d,), (EMBED,))  # LoRA; learned positions (GPT-2's layout) fuse q, k and v as GPT-2's c_attn does
        fused = self.positions == "learned" if self.fused_projections is None else self.fused_projections
        self.lora = adapters({"q": (*into, (h, hd), (HEADS, HEAD_DIM)), "k": (*into, (kv, hd), (KV_HEADS, HEAD_DIM)),
                              "v": (*into, (kv, hd), (KV_HEADS, HEAD_DIM)),
                              "o": ((h, hd), (HEADS, HEAD_DIM), (d,), (EMBED,))},
                             ("q", "k", "v", "o"), fuse=QKV if fused else ())
        self.rope = configure(RoPE) if self.positions == "rope" else None
        self.cache = configure(KVCache, window=self.sliding_window) if self.decode else None
        self.drop = nn.Dropout(self.dropout)

    def __call__(self, x: jax.Array, positions: jax.Array, deterministic: bool = True,
                 segments: jax.Array | None = None) -> jax.Array:
        dtype = self._activation_dtype
        q = dense("bsd,dnh->bsnh", x, self.wq, self.bq, dtype, self._matmul_dtype)  # [batch, seq, heads, head_dim]
        k = dense("bsd,dnh->bsnh", x, self.wk, self.bk, dtype, self._matmul_dtype)  # [batch, seq, kv_heads, head_dim]
        v = dense("bsd,dnh->bsnh", x, self.wv, self.bv, dtype, self._matmul_dtype)
        q, k, v = adapt(self.lora, x, {"q": q, "k": k, "v": v}, deterministic)
        q = nn.with_logical_constraint(q, (BATCH, SEQ, HEADS, HEAD_DIM))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        with jax.named_scope(ATTENTION_SCORES):
            out = self._attend(q, k, v, positions, segments)
        y = dense("bshk,hkd->bsd", out, self.wo, self.bo, dtype, self._matmul_dtype)
        (y,) = adapt(self.lora, out, {"o": y}, deterministic)
        return self.drop(y, deterministic=deterministic)

    def _attend(self, q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                segments: jax.Array | None) -> jax.Array:
        """Each query's softmax-weighted values: ``q: [batch, seq, heads, head_dim]``, ``k, v:
        [batch, seq, kv_heads, head_dim] -> [batch, seq, heads, head_dim]``, by the ``kernel``."""
        if self.cache is not None:  # a masked step over the cache (the flash kernels want whole sequences)
            return grouped_attention(q, *self.cache(k, v, positions), self.scale, self.attn_softcap)
        kernel = self.kernel(q.shape[1])
        if kernel == "splash":
            return splash_attention(q, k, v, segments, scale=self.scale, window=self.sliding_window,
                                    softcap=self.attn_softcap, fused_backward=self.splash_fused_backward,
                                    interpret=backend() != "tpu")
        same = None if segments is None else (segments[:, None, :, None] == segments[:, None, None, :])
        if kernel is None:  # a key sees itself and those before
            index = jnp.arange(q.shape[1])
            mask = causal_mask(index, index, self.sliding_window)[None, None]
            return grouped_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
                                     mask if same is None else mask & same, self.scale, self.attn_softcap)
        window = None if self.sliding_window is None else (self.sliding_window - 1, 0)
        return jax.nn.dot_product_attention(q, k, v, mask=same, scale=self.scale, is_causal=True,
                                            local_window_size=window, implementation=kernel)

    def kernel(self, seq: int) -> str | None:
        """What computes the attention of ``seq`` positions: ``attention_impl`` with ``auto``
        resolved for the platform being traced for (``backend()``): splash on a TPU where it skips
        masked blocks (``skips_blocks``: a sequence of several of its blocks), else theseus's own
        (None). Splash only where its blocks divide ``seq`` (else theseus's own); soft-capped
        scores, which jax.nn.dot_product_attention does not compute, written out."""
        kernel = self.attention_impl
        if kernel == "auto":
            kernel = "splash" if backend() == "tpu" and skips_blocks(seq, self.sliding_window) else None
        if kernel == "splash" and block_size(seq) is None or kernel == "xla" and self.attn_softcap is not None:
            return None
        return kernel

    def flops(self, seq: int) -> int:
        """Projections (q, o: d_model x heads x head_dim; k, v: d_model x kv width) and their adapters,
        then scores and values: 2 x 2 x heads x head_dim forward a (query, key) pair, x 3 with
        backward, over the pairs the kernel computes (``attention_pairs``)."""
        projections = sum(self.dense_flops(name, seq) for name in ("wq", "wk", "wv", "wo"))
        return projections + lora_flops(self.lora, seq) + 12 * self.n_heads * self.head_dim * self.attention_pairs(seq)

    def attention_pairs(self, seq: int) -> int:
        """The (query, key) pairs of one sequence whose scores are computed, as the ``kernel``
        computes them: splash the blocks its mask reaches (``splash.computed_pairs``: about half
        of them causal, fewer in a sliding window), the others all ``seq x seq``."""
        if self.kernel(seq) == "splash":
            return computed_pairs(seq, self.sliding_window)
        return seq * seq

    def flops_note(self, seq: int) -> str:
        """The kernel, and the share of the ``seq x seq`` pairs counted."""
        if self.kernel(seq) == "splash":
            share = computed_pairs(seq, self.sliding_window) / seq**2
            return (f"attention by splash: {share:.3g} x seq^2 pairs, the blocks of {block_size(seq)} its mask "
                    f"reaches (XLA does not count inside the kernel)")
        return f"attention {self.kernel(seq) or 'written out'}: seq^2 pairs, masked ones too"


class Block(Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``+ mlp(norm(x))``; x: [batch, seq, d_model].
    With ``post_norms``, each branch's output is normalised too before it joins the residual
    (Gemma 2/3's: ``x + norm(attn(norm(x)))``).

    Its children are class attributes that a subclass overrides (``mlp_cls = MyMLP``);
    ``components()`` follows them. ``norms`` maps each ``architecture.norm`` choice to its class.
    ``segments`` (packed sequences) reach the attention by keyword, only when given: an
    attention written as ``__call__(self, x, positions, deterministic=True)`` serves any other run.
    """

    attention_cls: ClassVar[type[Module]] = Attention
    mlp_cls: ClassVar[type[Module]] = MLP
    norms: ClassVar[Mapping[str, type[Module]]] = NORMS

    norm: str = architecture.norm()
    post_norms: bool = field("architecture.post_norms", default=False,
                             help="normalise the attention's and the MLP's outputs too, before each joins the residual "
                                  "(Gemma 2/3)")
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
        self.ln_1_post = configure(norm) if self.post_norms else None
        self.ln_2_post = configure(norm) if self.post_norms else None

    def __call__(self, x: jax.Array, positions: jax.Array, deterministic: bool = True,
                 segments: jax.Array | None = None) -> jax.Array:
        h = self.attn(self.ln_1(x), positions, deterministic, **packed(type(self.attn), segments))
        x = x + (h if self.ln_1_post is None else self.ln_1_post(h))
        h = self.mlp(self.ln_2(x), deterministic)
        x = x + (h if self.ln_2_post is None else self.ln_2_post(h))
        return nn.with_logical_constraint(x, (BATCH, SEQ, EMBED))

    def flops(self, seq: int) -> int:
        """Attention + MLP (the norms do no matmuls)."""
        return self.attn.flops(seq) + self.mlp.flops(seq)

    def flops_note(self, seq: int) -> str | None:
        return self.attn.flops_note(seq)
