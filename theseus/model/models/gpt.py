"""GPT: a decoder-only transformer language model. GPT-2 small by default; Llama-style by keys
(``norm=rmsnorm activation=swiglu positions=rope bias=false tie_embeddings=false n_kv_heads=K``),
and the other families' layouts by theirs (``qk_norm``, ``sliding_window`` with ``global_every``,
``post_norms``, ``scale_embeddings``, ``attn_softcap``, ``logit_softcap``, ``rope_scaling.*``...).

    with configuration(cfg):
        model = configure(GPT, vocab_size=tokenizer_vocab_size)
    params = model.init(key, tokens)["params"]
    logits = model.apply({"params": params}, tokens)  # tokens: int32[batch, seq]
    logits = model.apply({"params": params}, tokens, segments=segments)  # packed: segments int32[batch, seq]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import BATCH, BATCH_MESH_AXES, EMBED, FSDP, HEADS, KV_HEADS, LAYERS, MLP_HIDDEN, SEQ, TENSOR, VOCAB, ShardingPlan
from theseus.config import NON_NEGATIVE, POSITIVE, RUNTIME, ConfigError, configure, field
from theseus.model import architecture
from theseus.model.layers import (
    NORMS,
    WEIGHT_PRODUCT,
    Block,
    Embedding,
    PositionEmbedding,
    check_heads,
    check_norm,
    check_vocab_size,
    dense,
    packed,
    param,
)
from theseus.model.module import AUXILIARY, Module, drawing_values
from theseus.model.splash import ATTENTION_OUTPUT

OUTPUT_HEAD = "output_head"  # the name scope of the logits' product (the dry run's traffic rows)
# What each block keeps for the backward pass (architecture.remat); "none" keeps everything.
REMAT_POLICIES: dict[str, Callable] = {
    "dots": jax.checkpoint_policies.save_from_both_policies(  # matmul outputs, splash's; recompute the rest
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names(WEIGHT_PRODUCT, ATTENTION_OUTPUT)),
    "full": jax.checkpoint_policies.nothing_saveable,  # only the block's input; recompute all
}


def traced_once(block_cls: type[Module]) -> type[Module]:
    """``block_cls`` whose call is traced once for all its layers alike (Flax's ``nn.jit``: the
    same class, fields, configuration, variables' shapes and arguments), not once a layer:
    SmolLM2's 30 layers trace in a quarter of the time (a command's start, a step's
    compilation), and XLA inlines the calls into the same program. Keyed by the logical-axis
    rules in force, which a trace bakes in; ``deterministic`` (argument 3) stays a Python bool.
    Dropout's keys reach each layer as Flax's lifted transforms pass them (each layer its own)."""
    rules = tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in nn.get_logical_axis_rules())
    return _traced_once(block_cls, rules)


@functools.cache
def _traced_once(block_cls: type[Module], rules: tuple) -> type[Module]:
    return nn.jit(block_cls, static_argnums=(3,))


@functools.cache  # one class for every layer: a trace shared by the layers is keyed by their class
def _remat_class(block_cls: type[Module], remat: str, prevent_cse: bool) -> type[Module]:
    # deterministic (argument 3, self being 0) is a Python bool; a scan body needs no CSE guard
    return nn.remat(block_cls, policy=REMAT_POLICIES[remat], static_argnums=(3,), prevent_cse=prevent_cse)


class GPT(Module):
    """``tokens: int32[batch, seq] -> logits [batch, seq, vocab_size]`` in the activation dtype.

    Token (+ learned position) embedding, dropout, ``n_layers`` pre-norm Blocks, a final norm
    and the output head (the token embedding itself when tied), its logits soft-capped with
    ``logit_softcap`` (Gemma's). A subclass swaps a child by its class attribute (``block_cls =
    MyBlock``); ``components()`` follows. Layers may differ: ``layer_cls(i)`` picks layer i's
    class, ``layer_settings(i)`` the keys it takes over the model's (with ``sliding_window``,
    the layers every ``global_every``-th attend to the whole context, Gemma's global layers,
    and the others, with ``rope_theta_local``, rotate by their own base).

    ``remat`` recomputes each block's activations in the backward pass (``nn.remat`` of
    ``block_cls``); ``scan_layers`` runs the blocks as one ``nn.scan``, their parameters stacked
    on a leading ``layers`` axis (``params["h"]``, not ``h_0 .. h_{n-1}``: ``stack_layers`` and
    ``unstack_layers`` convert), so that compile time does not grow with depth.
    """

    block_cls: ClassVar[type[Module]] = Block
    embedding_cls: ClassVar[type[Module]] = Embedding
    position_embedding_cls: ClassVar[type[Module]] = PositionEmbedding
    norms: ClassVar[Mapping[str, type[Module]]] = NORMS

    # The whole architecture, so that a GPT's fields alone determine its network: its children
    # take these values (Module.own_configuration), whatever configuration they are built under.
    vocab_size: int | None = architecture.vocab_size()
    seq_len: int = architecture.seq_len()
    n_layers: int = field("architecture.n_layers", default=12, check=POSITIVE, help="transformer blocks")
    d_model: int = architecture.d_model()
    n_heads: int = architecture.n_heads()
    n_kv_heads: int | None = architecture.n_kv_heads()
    head_dim: int | None = architecture.head_dim()
    d_ff: int | None = architecture.d_ff()
    dropout: float = architecture.dropout()
    bias: bool = architecture.bias()
    qkv_bias: bool = architecture.qkv_bias()
    norm: str = architecture.norm()
    activation: str = architecture.activation()
    positions: str = architecture.positions()
    rope_theta: float = architecture.rope_theta()
    norm_eps: float = architecture.norm_eps()
    tie_embeddings: bool = field("architecture.tie_embeddings", default=True, help="output head = token embedding")
    logit_softcap: float | None = field("architecture.logit_softcap", default=None, check=POSITIVE,
                                        help="soft-cap the output logits to (-c, c) by c * tanh(logit / c) (Gemma); "
                                             "None: no cap")
    sliding_window: int | None = architecture.sliding_window()
    global_every: int = field("architecture.global_every", default=0, check=NON_NEGATIVE,
                              help="with sliding_window: every N-th layer (N-1, 2N-1, ...) attends to the whole "
                                   "context instead (Gemma's global layers); 0: every layer slides")
    rope_theta_local: float | None = field("architecture.rope_theta_local", default=None, check=POSITIVE,
                                           help="the RoPE base of the sliding-window layers, unscaled (Gemma 3's "
                                                "rope_local_base_freq); None: rope_theta and its scaling")
    init_std: float = architecture.init_std()
    attention_impl: str | None = architecture.attention_impl()
    splash_fused_backward: bool = architecture.splash_fused_backward()
    remat: str = field(
        "architecture.remat", default="none", choices=("none", *REMAT_POLICIES),
        help="recompute block activations in the backward pass: none, dots (keep matmul and splash attention "
             "outputs), full",
        resumable=True,  # the same numbers, another memory/compute trade (scan_layers changes the tree)
        role=RUNTIME,
    )
    scan_layers: bool = field(
        "architecture.scan_layers", default=False,
        help="the blocks as one nn.scan, parameters stacked on a 'layers' axis (compile time flat in depth)",
        role=RUNTIME,
    )
    decode: bool = False  # not a config key: one chunk at a time through a KV cache (theseus.model.generate)

    def __post_init__(self):
        check_vocab_size(self.vocab_size)
        super().__post_init__()  # each field within its declared range, before the shapes are checked
        check_heads(self.d_model, self.n_heads, self.n_kv_heads, self.positions, self.head_dim)
        check_norm(self.norm, type(self))
        for key, value in (("global_every", self.global_every), ("rope_theta_local", self.rope_theta_local)):
            if value and self.sliding_window is None:
                raise ConfigError(f"architecture.{key}={value} sets the sliding-window layers apart, but "
                                  f"architecture.sliding_window is null: set architecture.sliding_window=W, or drop "
                                  f"architecture.{key}")
        if self.scan_layers and len({tuple(sorted(self.layer_settings(i).items())) for i in range(self.n_layers)}) > 1:
            raise ConfigError(f"architecture.scan_layers=true repeats one block, but architecture.global_every="
                              f"{self.global_every} mixes sliding-window and global layers: set "
                              f"architecture.scan_layers=false")

    @classmethod
    def components(cls) -> list[type]:
        return [cls.embedding_cls, cls.position_embedding_cls, cls.block_cls, *cls.norms.values()]

    @property
    def sharding(self) -> ShardingPlan:
        """Batch over (data, fsdp, expert); weights' embed axis over fsdp (ZeRO-3); vocab, heads and MLP
        width over tensor (Megatron). Batch comes first: Flax's rules give a mesh axis to the
        first logical axis that claims it, so activations split batch, not embed, over fsdp."""
        return ShardingPlan({
            BATCH: BATCH_MESH_AXES, EMBED: FSDP, VOCAB: TENSOR, HEADS: TENSOR, KV_HEADS: TENSOR, MLP_HIDDEN: TENSOR,
            LAYERS: None,  # scanned layers: every device holds its share of each layer
        })

    def setup(self):
        self.wte = configure(self.embedding_cls)
        self.wpe = configure(self.position_embedding_cls) if self.positions == "learned" else None
        self.drop = nn.Dropout(self.dropout)
        if self.scan_layers:  # one block, whose variables __call__'s scan stacks n_layers deep
            self.h = configure(self._rematted(self.block_cls), decode=self.decode, **self.layer_settings(0))
        else:
            self.h = [configure(self._traced(self._rematted(self.layer_cls(i))), decode=self.decode,
                                **self.layer_settings(i)) for i in range(self.n_layers)]
        self.ln_f = configure(self.norms[self.norm])
        if not self.tie_embeddings:
            init = nn.initializers.normal(self.init_std)
            self.lm_head = param(self, "lm_head", init, (EMBED, VOCAB), (self.d_model, self.vocab_size))
        if self.decode:  # the next position: int32 (every row alike) or int32[batch] (theseus.model.generate's)
            self.index = self.variable("cache", "index", jnp.zeros, (), jnp.int32)

    def layer_cls(self, index: int) -> type[Module]:
        """The block class of layer ``index`` (unrolled layers; a scan repeats ``block_cls``)."""
        return self.block_cls

    def layer_settings(self, index: int) -> dict[str, Any]:
        """The config keys layer ``index``'s block takes over the model's (``{}``: the model's own):
        with a sliding window, a global layer (every ``global_every``-th) drops it, and a
        sliding one rotates by ``rope_theta_local`` (unscaled) where that is set."""
        if self.sliding_window is None:
            return {}
        if self.global_every and (index + 1) % self.global_every == 0:
            return {"architecture.sliding_window": None}
        if self.rope_theta_local is not None:
            return {"architecture.rope_theta": self.rope_theta_local, "architecture.rope_scaling.type": "none"}
        return {}

    def _traced(self, block_cls: type[Module]) -> type[Module]:
        """``block_cls`` traced once for its layers alike (``traced_once``) unless parameters are
        being drawn: an init draws each layer's from its own path's key, as it always has."""
        return block_cls if drawing_values(self) else traced_once(block_cls)

    def _rematted(self, block_cls: type[Module]) -> type[Module]:
        """``block_cls`` recomputed in the backward pass per ``architecture.remat``."""
        if self.remat == "none":
            return block_cls
        return _remat_class(block_cls, self.remat, not self.scan_layers)

    def __call__(self, tokens: jax.Array, deterministic: bool = True, segments: jax.Array | None = None) -> jax.Array:
        """``segments: int32[batch, seq]``: several sequences packed in a row (ids ascending, one
        per sequence), each attending only to itself, its positions restarting at 0."""
        positions = self._positions(tokens.shape[1])
        if segments is not None:
            positions = segment_positions(segments)
        x = self.wte(tokens)  # [batch, seq, d_model]
        if self.wpe is not None:
            x = x + self.wpe(positions)
        x = nn.with_logical_constraint(self.drop(x, deterministic=deterministic), (BATCH, SEQ, EMBED))
        if self.scan_layers:
            x = self._scan_blocks(x, positions, deterministic, segments)
        else:
            for i, block in enumerate(self.h):
                x = block(x, positions, deterministic, **packed(self.layer_cls(i), segments))
        x = self.ln_f(x)
        with jax.named_scope(OUTPUT_HEAD):
            logits = (self.wte.attend(x) if self.tie_embeddings else
                      dense("bsd,dv->bsv", x, self.lm_head, None, x.dtype, self._matmul_dtype))
            if self.logit_softcap is not None:
                capped = self.logit_softcap * jnp.tanh(logits.astype(jnp.float32) / self.logit_softcap)
                logits = capped.astype(x.dtype)
        return nn.with_logical_constraint(logits, (BATCH, SEQ, VOCAB))

    def _scan_blocks(self, x: jax.Array, positions: jax.Array, deterministic: bool,
                     segments: jax.Array | None) -> jax.Array:
        """``x: [batch, seq, d_model]`` through ``self.h`` n_layers times, a layer's parameters
        (and KV cache) per iteration; ``deterministic`` stays a Python bool (closed over)."""

        def body(block: Module, x: jax.Array, positions: jax.Array, segments: jax.Array | None) -> tuple[jax.Array, None]:
            return block(x, positions, deterministic, **packed(self.block_cls, segments)), None

        scan = nn.scan(body, variable_axes={"params": 0, "cache": 0, AUXILIARY: 0}, split_rngs={"params": True, "dropout": True},
                       in_axes=nn.broadcast, length=self.n_layers, metadata_params={nn.PARTITION_NAME: LAYERS})
        return scan(self.h, x, positions, segments)[0]

    def _positions(self, seq: int) -> jax.Array:
        """``int32[seq]``: 0 .. seq-1, or when decoding the ``seq`` from the cache's index on
        (``int32[batch, seq]`` when the index is each row's)."""
        if not self.decode:
            if seq > self.seq_len:
                raise ValueError(f"a sequence of {seq} tokens exceeds architecture.seq_len ({self.seq_len})")
            return jnp.arange(seq)
        start = self.index.value
        self.index.value = start + seq
        return start[..., None] + jnp.arange(seq)

    def flops(self, seq: int) -> int:
        """Forward + backward FLOPs of one sequence of ``seq`` tokens.

        Convention (PaLM's; nanoGPT's estimate_mfu): 6 x (parameters in matmuls) x seq, plus
        12 x heads x head_dim for attention scores and values per (query, key) pair its kernel
        computes (``Attention.attention_pairs``: written out, all seq^2 of them; splash, on a
        TPU, the blocks its causal or sliding-window mask reaches). Lookups, norms and
        elementwise ops are not counted. It is the blocks' count plus the output head's matmul
        (d_model x vocab_size); ``flops(seq, trainable=mask)`` leaves out the gradients of
        frozen weights (``Module.dense_flops``).
        """
        head = self.wte.dense_flops("embedding", seq) if self.tie_embeddings else self.dense_flops("lm_head", seq)
        return sum(block.flops(seq) for block in self._blocks) + head

    def flops_note(self, seq: int) -> str | None:
        """Its layers' notes (a sliding-window model's two kinds of layer: each once)."""
        return "; ".join(dict.fromkeys(note for block in self._blocks if (note := block.flops_note(seq)))) or None

    @property
    def _blocks(self) -> Sequence[Module]:
        return self.h if isinstance(self.h, Sequence) else [self.h] * self.n_layers  # scanned: one, n times


def segment_positions(segments: jax.Array) -> jax.Array:
    """``int32[batch, seq]``: each position's index within its segment (a run of equal ids)."""
    index = jnp.arange(segments.shape[1])
    starts = jnp.concatenate([jnp.ones_like(segments[:, :1], bool), segments[:, 1:] != segments[:, :-1]], axis=1)
    return index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)


def stack_layers(params: Mapping[str, Any]) -> dict[str, Any]:
    """An unrolled GPT's params (``h_0 .. h_{n-1}``) as a scanned one's (``h``: every leaf
    stacked on a new leading ``[n_layers]`` axis); the other entries are kept."""
    n = len([key for key in params if _layer_index(key) is not None])
    rest = {key: value for key, value in params.items() if _layer_index(key) is None}
    if n == 0:
        raise ValueError("stack_layers: no h_0 .. h_{n-1} entries (already stacked?)")
    return {**rest, "h": jax.tree.map(lambda *layers: jnp.stack(layers), *(params[f"h_{i}"] for i in range(n)))}


def unstack_layers(params: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of ``stack_layers``: ``h`` (leaves ``[n_layers, ...]``) split into ``h_0 ..``."""
    if "h" not in params:
        raise ValueError("unstack_layers: no stacked 'h' entry (already unrolled?)")
    stacked = params["h"]
    n = jax.tree.leaves(stacked)[0].shape[0]
    rest = {key: value for key, value in params.items() if key != "h"}
    return {**rest, **{f"h_{i}": jax.tree.map(lambda leaf, i=i: leaf[i], stacked) for i in range(n)}}


def _layer_index(key: str) -> int | None:
    """``i`` for an unrolled block's entry ``h_i``, else None."""
    prefix, _, index = key.partition("_")
    return int(index) if prefix == "h" and index.isdigit() else None
