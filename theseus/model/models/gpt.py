"""GPT: a decoder-only transformer language model. GPT-2 small by default; Llama-style by keys
(``norm=rmsnorm activation=swiglu positions=rope bias=false tie_embeddings=false n_kv_heads=K``).

    with configuration(cfg):
        model = configure(GPT, vocab_size=tokenizer_vocab_size)
    params = model.init(key, tokens)["params"]
    logits = model.apply({"params": params}, tokens)  # tokens: int32[batch, seq]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import BATCH, DATA, EMBED, FSDP, HEADS, KV_HEADS, MLP_HIDDEN, SEQ, TENSOR, VOCAB, ShardingPlan
from theseus.config import ConfigError, configure, field, register
from theseus.model.layers import (
    NORMS,
    Block,
    Embedding,
    PositionEmbedding,
    check_heads,
    check_norm,
    check_vocab_size,
    param,
)
from theseus.model.module import Module


@register("model", "gpt")
class GPT(Module):
    """``tokens: int32[batch, seq] -> logits [batch, seq, vocab_size]`` in the activation dtype.

    Token (+ learned position) embedding, dropout, ``n_layers`` pre-norm Blocks, a final norm
    and the output head (the token embedding itself when tied). A subclass swaps a child by its
    class attribute (``block_cls = MyBlock``); ``components()`` follows.
    """

    block_cls: ClassVar[type[Module]] = Block
    embedding_cls: ClassVar[type[Module]] = Embedding
    position_embedding_cls: ClassVar[type[Module]] = PositionEmbedding
    norms: ClassVar[Mapping[str, type[Module]]] = NORMS

    # The whole architecture, so that a GPT's fields alone determine its network: its children
    # take these values (Module.own_configuration), whatever configuration they are built under.
    vocab_size: int | None = field("architecture/vocab_size", default=None, help="vocabulary; None: the tokenizer's")
    seq_len: int = field("architecture/seq_len", default=1024, help="context length; data windows use it")
    n_layers: int = field("architecture/n_layers", default=12, help="transformer blocks")
    d_model: int = field("architecture/d_model", default=768, help="width of the residual stream")
    n_heads: int = field("architecture/n_heads", default=12, help="attention (query) heads")
    n_kv_heads: int | None = field("architecture/n_kv_heads", default=None, help="key/value heads; None: n_heads")
    d_ff: int | None = field("architecture/d_ff", default=None, help="hidden width of the MLP; None: 4 x d_model")
    dropout: float = field("architecture/dropout", default=0.0, help="dropout rate (training only)")
    bias: bool = field("architecture/bias", default=True, help="add biases to linear layers and norms")
    norm: str = field("architecture/norm", default="layernorm", help="normalisation layer: layernorm or rmsnorm")
    activation: str = field(
        "architecture/activation", default="gelu", choices=("gelu", "swiglu"), help="MLP nonlinearity"
    )
    positions: str = field(
        "architecture/positions", default="learned", choices=("learned", "rope"), help="position encoding"
    )
    rope_theta: float = field("architecture/rope_theta", default=10000.0, help="RoPE base wavelength")
    tie_embeddings: bool = field("architecture/tie_embeddings", default=True, help="output head = token embedding")
    init_std: float = field("architecture/init_std", default=0.02, help="stddev of the normal initialiser")
    attention_impl: str | None = field(
        "architecture/attention_impl", default=None, choices=(None, "xla", "cudnn"),
        help="jax.nn.dot_product_attention implementation; None: JAX chooses",
    )
    decode: bool = False  # not a config key: one chunk at a time through a KV cache (theseus.model.generate)

    def __post_init__(self):
        check_vocab_size(self.vocab_size)
        for key in ("vocab_size", "seq_len", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "rope_theta",
                    "init_std"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise ConfigError(f"architecture.{key} must be positive, got {value}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"architecture.dropout must be in [0, 1), got {self.dropout}")
        check_heads(self.d_model, self.n_heads, self.n_kv_heads, self.positions)
        check_norm(self.norm, type(self))
        super().__post_init__()

    @classmethod
    def components(cls) -> list[type]:
        return [cls.embedding_cls, cls.position_embedding_cls, cls.block_cls, *cls.norms.values()]

    @property
    def sharding(self) -> ShardingPlan:
        """Batch over (data, fsdp); weights' embed axis over fsdp (ZeRO-3); vocab, heads and MLP
        width over tensor (Megatron). Batch comes first: Flax's rules give a mesh axis to the
        first logical axis that claims it, so activations split batch, not embed, over fsdp."""
        return ShardingPlan({
            BATCH: (DATA, FSDP), EMBED: FSDP, VOCAB: TENSOR, HEADS: TENSOR, KV_HEADS: TENSOR, MLP_HIDDEN: TENSOR,
        })

    def setup(self):
        self.wte = configure(self.embedding_cls)
        self.wpe = configure(self.position_embedding_cls) if self.positions == "learned" else None
        self.drop = nn.Dropout(self.dropout)
        self.h = [configure(self.block_cls, decode=self.decode) for _ in range(self.n_layers)]
        self.ln_f = configure(self.norms[self.norm])
        if not self.tie_embeddings:
            init = nn.initializers.normal(self.init_std)
            self.lm_head = param(self, "lm_head", init, (EMBED, VOCAB), (self.d_model, self.vocab_size))
        if self.decode:
            self.index = self.variable("cache", "index", jnp.zeros, (), jnp.int32)  # positions cached so far

    def __call__(self, tokens: jax.Array, deterministic: bool = True) -> jax.Array:
        positions = self._positions(tokens.shape[1])
        x = self.wte(tokens)  # [batch, seq, d_model]
        if self.wpe is not None:
            x = x + self.wpe(positions)
        x = nn.with_logical_constraint(self.drop(x, deterministic=deterministic), (BATCH, SEQ, EMBED))
        for block in self.h:
            x = block(x, positions, deterministic)
        x = self.ln_f(x)
        logits = self.wte.attend(x) if self.tie_embeddings else x @ self.lm_head.astype(x.dtype)
        return nn.with_logical_constraint(logits, (BATCH, SEQ, VOCAB))

    def _positions(self, seq: int) -> jax.Array:
        """``int32[seq]``: 0 .. seq-1, or when decoding the next ``seq`` after those cached."""
        if not self.decode:
            if seq > self.seq_len:
                raise ValueError(f"a sequence of {seq} tokens exceeds architecture.seq_len ({self.seq_len})")
            return jnp.arange(seq)
        start = self.index.value
        self.index.value = start + seq
        return start + jnp.arange(seq)

    def flops(self, seq: int) -> int:
        """Forward + backward FLOPs of one sequence of ``seq`` tokens.

        Convention (PaLM's; nanoGPT's estimate_mfu): 6 x (parameters in matmuls) x seq, plus
        12 x n_layers x d_model x seq^2 for attention scores and values, in full (not halved
        for causality). Lookups, norms and elementwise ops are not counted. It is the blocks'
        count plus the output head's matmul (d_model x vocab_size).
        """
        return sum(block.flops(seq) for block in self.h) + 6 * self.d_model * self.vocab_size * seq
