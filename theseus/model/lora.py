"""LoRA (Hu et al. 2021): low-rank adapters on a model's projections, the base weights frozen.

A targeted projection ``y = x W`` computes ``y = x W + (alpha / rank) dropout(x) A B``, with
``A: [*in, rank]`` initialised as peft initialises ``lora_A`` (uniform in +-1/sqrt(fan_in)) and
``B: [rank, *out]`` zeros, so that step 0 computes the base model; the scale is peft's
``lora_alpha / r``. Each adapter is a child ``lora_<target>`` of the layer it adapts, its
parameters carrying the weight's logical axes (the rank axis is replicated), so it shards with
its weight on any mesh. Training updates the adapters alone (``labels``: the optimizer's split).

Targets (``architecture.lora.targets``): ``q``, ``k``, ``v``, ``o`` (attention), ``gate``,
``up``, ``down`` (the MLP's ``w_gate``, ``w_up`` and ``w_out``). Projections a Hugging
Face model stores fused share one adapter (``architecture.fused_projections``): any of q, k, v
in targets gives one adapter ``lora_qkv`` with one ``A`` and a ``B`` per projection (GPT-2's
``c_attn``, the default with learned positions; Phi-3's ``qkv_proj``), as any of gate, up gives
``lora_gateup`` (Phi-3's ``gate_up_proj``): peft's ``target_modules=["c_attn"]`` and the like.
Llama-style models adapt each projection on its own. A mixture
of experts adapts each expert's gate, up and down (``lora_expert_<target>``: one A and B per
expert, stacked on the experts' axis like the experts' weights).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import string
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from jax.tree_util import DictKey

from theseus.config import FRACTION, NON_NEGATIVE, POSITIVE, ConfigError, Configurable, configure, configured, field
from theseus.model.module import Module, param

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
QKV, GATE_UP = ("q", "k", "v"), ("gate", "up")  # targets one adapter serves when the layer fuses them
GROUPS = {"".join(group): group for group in (QKV, GATE_UP)}  # a fused adapter's name after PREFIX -> its targets
PREFIX = "lora_"  # an adapter's module name: lora_q, lora_qkv, lora_down...
# the weight each target's update lands on
WEIGHTS = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w_gate", "up": "w_up", "down": "w_out"}
EXPERT = "expert_"  # an expert adapter's name after PREFIX: lora_expert_up adapts every expert's up
WEIGHTS |= {EXPERT + target: weight for target, weight in WEIGHTS.items() if target in ("gate", "up", "down")}

Projection = tuple[tuple[int, ...], tuple, tuple[int, ...], tuple]  # (in shape, in axes, out shape, out axes)


@dataclasses.dataclass(frozen=True)
class LoRA(Configurable):
    """The ``architecture.lora.*`` settings; rank 0: no adapters (every weight trains)."""

    rank: int = field("architecture.lora.rank", default=0, check=NON_NEGATIVE,
                      help="LoRA adapters' rank (peft's r); 0: off, every weight trains")
    alpha: float = field("architecture.lora.alpha", default=8.0, check=POSITIVE,
                         help="LoRA: updates are scaled by alpha / rank (peft's lora_alpha)")
    dropout: float = field("architecture.lora.dropout", default=0.0, check=FRACTION,
                           help="LoRA: dropout on the adapters' input (training only)")
    targets: list[str] = field(
        "architecture.lora.targets", default=["q", "v"],
        help="LoRA: projections adapted, among q, k, v, o, gate, up, down (GPT-2-style models: q, k, v "
             "adapt the fused c_attn as one)")

    def __post_init__(self):
        super().__post_init__()  # each field within its declared range
        unknown = [t for t in self.targets if t not in PROJECTIONS]
        if unknown:
            raise ConfigError(f"architecture.lora.targets has {unknown[0]!r}, which is not a projection: choose "
                              f"among {', '.join(PROJECTIONS)} (e.g. architecture.lora.targets=[q,v])")
        if self.rank and not self.targets:
            raise ConfigError(f"architecture.lora.targets=[] adapts no projection, so architecture.lora.rank="
                              f"{self.rank} would train every weight (a full fine-tune): name the projections "
                              f"(e.g. architecture.lora.targets=[q,v]), or set architecture.lora.rank=0")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def init_a(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32, lead: int = 0) -> jax.Array:
    """``A: [*lead, *in, rank]`` as peft's ``lora_A`` (Kaiming-uniform, a=sqrt(5)): uniform in
    +-1/sqrt(fan_in), fan_in the product of the input axes (``lead`` stacked axes excluded)."""
    bound = 1.0 / math.sqrt(math.prod(shape[lead:-1]))
    return jax.random.uniform(key, tuple(shape), dtype, -bound, bound)


class Adapter(Module):
    """One adapter: ``x: [batch, seq, *in] -> (scale dropout(x) A B_i: [batch, seq, *out_i], ...)``,
    one output per projection it serves (``names``: one, or q, k and v of a fused c_attn). With
    ``lead`` axes (a mixture's experts), one adapter per entry: ``x: [*lead, ..., *in]``,
    ``A: [*lead, *in, rank]``, ``B: [*lead, rank, *out]``.

    Not configured from keys: its layer gives the shapes, axes and ``LoRA`` settings.
    """

    rank: int = 0
    scale: float = 1.0
    rate: float = 0.0
    in_shape: tuple[int, ...] = ()
    in_axes: tuple = ()
    outs: tuple = ()  # ((target, out shape, out axes), ...)
    lead_shape: tuple[int, ...] = ()  # stacked adapters (experts), the weights' leading axes
    lead_axes: tuple = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.outs)

    def setup(self):
        lead, axes_ = self.lead_shape, self.lead_axes
        self.a = param(self, "a", functools.partial(init_a, lead=len(lead)), (*axes_, *self.in_axes, None),
                       (*lead, *self.in_shape, self.rank))
        single = len(self.outs) == 1
        self.b = tuple(param(self, "b" if single else f"b_{name}", nn.initializers.zeros, (*axes_, None, *axes),
                             (*lead, self.rank, *shape)) for name, shape, axes in self.outs)
        self.drop = nn.Dropout(self.rate)

    def __call__(self, x: jax.Array, deterministic: bool = True) -> tuple[jax.Array, ...]:
        dtype = self._activation_dtype
        x = self.drop(x, deterministic=deterministic).astype(dtype)
        if self.lead_shape:  # per expert: its rows [*lead, ...] through its own A and B
            n, n_in = len(self.lead_shape), len(self.in_shape)
            lead = tuple(range(n))
            h = jax.lax.dot_general(x, self.a.astype(dtype), ((tuple(range(x.ndim - n_in, x.ndim)),
                                                                tuple(range(n, n + n_in))), (lead, lead)))
            h = h * jnp.asarray(self.scale, dtype)
            return tuple(jax.lax.dot_general(h, b.astype(dtype), (((h.ndim - 1,), (n,)), (lead, lead)))
                         for b in self.b)
        h = jnp.tensordot(x, self.a.astype(dtype), len(self.in_shape)) * jnp.asarray(self.scale, dtype)
        return tuple(jnp.tensordot(h, b.astype(dtype), 1) for b in self.b)  # [batch, seq, rank] x [rank, *out]

    def flops(self, seq: int) -> int:
        """``A`` and each ``B`` at every position (stacked adapters: each entry at its share)."""
        share = seq / math.prod(self.lead_shape)  # an expert's adapter sees its own rows only
        names = ["a", *(("b",) if len(self.outs) == 1 else (f"b_{name}" for name in self.names))]
        return sum(self.dense_flops(name, share) for name in names)


def lora_flops(layer_adapters: Mapping[str, Adapter], seq: int) -> int:
    """Forward + backward FLOPs of a layer's adapters over ``seq`` positions."""
    return sum(adapter.flops(seq) for adapter in layer_adapters.values())


def adapters(projections: Mapping[str, Projection], family: Sequence[str], fuse: Sequence[str] = (),
             why: str | None = None, lead: tuple[tuple[int, ...], tuple] = ((), ())) -> dict[str, Adapter]:
    """A layer's adapters (built in its ``setup``, under its configuration): ``projections``,
    target -> its shapes and axes; ``family``, the targets such a layer serves (one it lacks is
    refused, saying ``why``); ``fuse``: targets that share one adapter (``QKV``: GPT-2's c_attn;
    ``GATE_UP``); ``lead``: the shape and axes of stacked adapters (a mixture's experts)."""
    settings = configure(LoRA)
    if not settings.rank:
        return {}
    wanted = [t for t in family if t in settings.targets]
    missing = [t for t in wanted if t not in projections]
    if missing:
        why = why or f"this model's layers have no such projection (they have {', '.join(projections)})"
        raise ConfigError(f"architecture.lora.targets has {missing[0]!r}, but {why}: drop it from "
                          f"architecture.lora.targets")
    if any(t in fuse for t in wanted):
        wanted = ["".join(fuse), *(t for t in wanted if t not in fuse)]
    out = {}
    for target in wanted:
        served = GROUPS.get(target, (target,))
        in_shape, in_axes = projections[served[0]][:2]
        full = min(math.prod(in_shape), *(math.prod(projections[t][2]) for t in served))
        if settings.rank > full:
            raise ConfigError(f"architecture.lora.rank={settings.rank} is more than the rank of the {target} "
                              f"projection it adapts ({full}): a low-rank adapter past its weight's rank only adds "
                              f"parameters; set architecture.lora.rank to at most {full}")
        out[target] = configure(Adapter, rank=settings.rank, scale=settings.scale, rate=settings.dropout,
                                in_shape=in_shape, in_axes=in_axes, lead_shape=lead[0], lead_axes=lead[1],
                                outs=tuple((t, *projections[t][2:]) for t in served))
    return out


def adapt(layer_adapters: Mapping[str, Adapter], x: jax.Array, ys: Mapping[str, jax.Array],
          deterministic: bool) -> tuple[jax.Array, ...]:
    """The projections ``ys`` (target -> ``x W``, in order) with the updates of the adapters
    that serve them added; ``x`` is their common input."""
    out = dict(ys)
    for adapter in layer_adapters.values():
        if all(name in ys for name in adapter.names):
            for name, delta in zip(adapter.names, adapter(x, deterministic), strict=True):
                out[name] = out[name] + delta
    return tuple(out.values())


def is_adapter(path: Sequence[Any]) -> bool:
    """Whether a pytree path (keys, or a ``/``-joined string) lies inside an adapter."""
    parts = path.split("/") if isinstance(path, str) else [str(p.key) for p in path if isinstance(p, DictKey)]
    return any(part.startswith(PREFIX) for part in parts)


def has_adapters(params: Any) -> bool:
    return any(is_adapter(path) for path, _ in jax.tree_util.tree_leaves_with_path(params))


def labels(params: Any) -> Any:
    """Per leaf, ``"adapter"`` or ``"frozen"`` (optax.multi_transform's labels): with adapters,
    only they train."""
    return jax.tree_util.tree_map_with_path(lambda path, _: "adapter" if is_adapter(path) else "frozen", params)


def trainable(params: Any) -> Any:
    """Per leaf of ``params``, whether the optimizer trains it (a static mask of Python bools,
    from the paths alone): the adapters alone when the params have any, else every leaf. The
    train step differentiates these alone."""
    every = not has_adapters(params)
    return jax.tree.map(lambda label: every or label == "adapter", labels(params))


def settings_of(model: Module) -> LoRA:
    """The ``LoRA`` settings a built model was configured with."""
    return configured(LoRA, model.own_configuration())


def without_adapters(model: Module) -> Module:
    """The same model without LoRA (its ``architecture.lora.*`` keys at their defaults): what a
    merged parameter tree (``merged``) is applied with."""
    values = model.own_configuration().to_dict()
    values.get("architecture", {}).pop("lora", None)
    return configured(type(model), values)


def merged(params: Mapping, scale: float) -> dict:
    """A host copy of ``params`` (nested dicts of arrays, stacked or not) without adapters, each
    targeted weight ``W + scale A B`` (float32 sums, cast back to W's dtype)."""
    flat = {path: np.asarray(leaf) for path, leaf in traverse_util.flatten_dict(params, sep="/").items()}
    out = {path: leaf for path, leaf in flat.items() if not is_adapter(path)}
    for path in sorted({p.rsplit("/", 1)[0] for p in flat if is_adapter(p)}):
        layer, name = path.rsplit("/", 1)
        served = GROUPS.get(name.removeprefix(PREFIX), (name.removeprefix(PREFIX),))
        a = flat[f"{path}/a"]
        for target in served:
            b = flat[f"{path}/b" if len(served) == 1 else f"{path}/b_{target}"]
            weight = f"{layer}/{WEIGHTS[target]}"
            out[weight] = (out[weight].astype(np.float32) + scale * _product(a, b, out[weight].ndim)
                           ).astype(out[weight].dtype)
    return traverse_util.unflatten_dict(out, sep="/")


def _product(a: np.ndarray, b: np.ndarray, w_ndim: int) -> np.ndarray:
    """``A B`` contracting the rank: ``a: [*lead, *in, r]``, ``b: [*lead, r, *out]`` ->
    ``[*lead, *in, *out]`` (``w_ndim``: its rank, which fixes how many axes lead)."""
    lead = a.ndim + b.ndim - 2 - w_ndim
    n_in, n_out = a.ndim - lead - 1, b.ndim - lead - 1
    letters = iter(string.ascii_lowercase[:-1])
    batch, ins, outs = ("".join(next(letters) for _ in range(n)) for n in (lead, n_in, n_out))
    return np.einsum(f"{batch}{ins}z,{batch}z{outs}->{batch}{ins}{outs}", a.astype(np.float32), b.astype(np.float32))


def initial(path: str, shape: Sequence[int], dtype: Any, seed: int = 0) -> np.ndarray:
    """A fresh adapter parameter for a checkpoint that holds none (a Hugging Face base): ``B``
    zeros, ``A`` as ``init_a`` with a key from ``seed`` and the path (``h/...``: stacked layers)."""
    if path.rsplit("/", 1)[-1] != "a":
        return np.zeros(shape, dtype)
    key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(path.encode()))
    lead = int(path.startswith("h/")) + int(f"/{PREFIX}{EXPERT}" in path)  # stacked layers, experts
    return np.asarray(init_a(key, shape, jnp.float32, lead=lead)).astype(dtype)
