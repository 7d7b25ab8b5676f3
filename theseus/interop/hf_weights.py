"""Safetensors tensors <-> theseus's GPT parameter tree, per Hugging Face ``model_type``.

Each model_type's mapping is one table of ``Rule``s (``rules``), read in both directions: a rule
pairs parameters with the tensors they come from, ``load`` one way and ``save``, its exact
inverse (split, transpose, reshape, concatenate), the other: import then export gives back
every tensor bit for bit. Paths are the unrolled tree (``h_0/attn/wq``); a
stacked (scanned) tree adapts ``to_theseus``/``to_hf`` alone.

Layouts: Hugging Face's ``nn.Linear`` weights are ``[out, in]``, GPT-2's ``Conv1D`` weights
``[in, out]``; theseus's are ``[in, ...out]`` with heads split out (``wq: [d_model, heads,
head_dim]``, ``wo: [heads, head_dim, d_model]``, ``w_gate``, ``w_up: [d_model, d_ff]``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flax import traverse_util

from theseus.config import ConfigError
from theseus.data.safetensors_file import SafetensorsFile, write_safetensors
from theseus.interop.hf_config import architecture
from theseus.model.models.gpt import stack_layers

WEIGHTS_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
IGNORED = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")  # buffers older transformers saved
GPT2_PREFIX = "transformer."
# Llama's layout, Phi-3's with its projections fused; the last two: mixtures of experts
LLAMA_LIKE = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "mixtral", "qwen2_moe")
# each MoE model_type's names: its feed-forward module, then each expert's (gate, up, down) projections
EXPERTS = {"mixtral": ("block_sparse_moe", ("w1", "w3", "w2")),
           "qwen2_moe": ("mlp", ("gate_proj", "up_proj", "down_proj"))}

Read = Callable[[str], np.ndarray]  # a tensor of the checkpoint by its Hugging Face name
Params = dict[str, np.ndarray]  # "h_0/attn/wq" -> array: traverse_util.flatten_dict(params, sep="/")


class Checkpoint:
    """The safetensors files of a Hugging Face folder: one ``model.safetensors`` or shards with
    their ``model.safetensors.index.json``. Reads one tensor at a time, a view of the memory-mapped
    file (``theseus.data.safetensors_file``), never pickle.

        with Checkpoint(folder) as ckpt:
            wte = ckpt.read("transformer.wte.weight")  # np.ndarray, the stored dtype
    """

    def __init__(self, folder: Path):
        index, single = folder / INDEX_FILE, folder / WEIGHTS_FILE
        self._open: dict[Path, SafetensorsFile] = {}  # each file's header, once read
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (ValueError, KeyError) as exc:
                raise ConfigError(f"{index} has no weight_map ({exc}): save the model again") from exc
            self.files = {name: folder / file for name, file in weight_map.items()}
        elif single.is_file():
            self._open[single] = SafetensorsFile(single)
            self.files = dict.fromkeys(self._open[single].tensors, single)
        elif any((folder / name).is_file() for name in PICKLE_FILES):
            raise ConfigError(
                f"{folder} holds pytorch_model.bin (pickle), which theseus does not load: convert it with "
                f"transformers: AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder, "
                f"safe_serialization=True)")
        else:
            raise ConfigError(f"{folder} has neither {WEIGHTS_FILE} nor {INDEX_FILE}: save the model with "
                              f"save_pretrained(folder, safe_serialization=True)")
        missing = sorted({str(path) for path in self.files.values() if not path.is_file()})
        if missing:
            raise ConfigError(f"{index} names {missing[0]}, which is missing: download or save every shard")
        self.used: set[str] = set()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self._open.clear()  # nothing held open: each tensor's map closes with the last view of it

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as stored (read-only); ConfigError naming it when the checkpoint
        lacks it, or its file is not a safetensors file."""
        if name not in self.files:
            raise ConfigError(f"the checkpoint has no tensor {name!r}: it does not match its config.json")
        path = self.files[name]
        if path not in self._open:
            self._open[path] = SafetensorsFile(path)
        self.used.add(name)
        return self._open[path].read(name)

    def unused(self) -> list[str]:
        """Tensors no ``read`` asked for, known buffers aside: weights an import would drop."""
        return sorted(name for name in self.files if name not in self.used and not name.endswith(IGNORED))


@dataclasses.dataclass(frozen=True)
class Rule:
    """Theseus parameters ``paths`` <-> Hugging Face tensors ``names``: ``load`` computes the
    parameters from the tensors, ``save`` the tensors from the parameters, its exact inverse."""

    paths: tuple[str, ...]
    names: tuple[str, ...]
    load: Callable[..., tuple[np.ndarray, ...]]
    save: Callable[..., tuple[np.ndarray, ...]]


def rules(model_type: str, arch: Mapping[str, Any], vocab_size: int) -> list[Rule]:
    """The mapping of ``model_type``, one table used in both directions: every parameter of a
    theseus model of architecture ``arch`` with the tensors it comes from (``vocab_size``: the
    rows an exported vocabulary keeps). ConfigError for a model_type without a mapping."""
    if model_type not in TABLES:
        raise ConfigError(f"model_type {model_type!r} has no weight mapping ({', '.join(TABLES)})")
    head = [] if arch["tie_embeddings"] else [Rule(("lm_head",), ("lm_head.weight",), lambda x: (x.T,),
                                                    lambda w: (w[:, :vocab_size].T,))]
    return [*TABLES[model_type](model_type, arch, vocab_size), *head]


def to_theseus(model_type: str, arch: Mapping[str, Any], read: Read) -> dict[str, Callable[[], np.ndarray]]:
    """Each theseus param path -> a thunk computing it from the checkpoint (one rule at a time).

    ``arch``: the run's architecture values (``theseus.interop.hf_config.arch_of``).
    """
    out: dict[str, Callable[[], np.ndarray]] = {}
    for rule in rules(model_type, arch, arch["vocab_size"]):
        for j, path in enumerate(rule.paths):
            out[path] = functools.partial(lambda rule, j: rule.load(*map(read, rule.names))[j], rule, j)
    return out


def to_hf(model_type: str, arch: Mapping[str, Any], params: Params, vocab_size: int) -> dict[str, np.ndarray]:
    """The Hugging Face tensors of a flat param tree, the inverse of ``to_theseus``; the
    vocabulary is cut to its first ``vocab_size`` rows (the trainer's padding removed).
    ConfigError when the mapping needs a parameter the tree lacks, or leaves one unused."""
    reads = _Reads(params, model_type)
    out: dict[str, np.ndarray] = {}
    for rule in rules(model_type, arch, vocab_size):
        out.update(zip(rule.names, rule.save(*(reads[path] for path in rule.paths)), strict=True))
    unused = reads.unused()
    if unused:
        raise ConfigError(f"parameter {unused[0]} (and {len(unused) - 1} more) has no place in a Hugging Face "
                          f"{model_type} checkpoint")
    return {key: np.ascontiguousarray(value) for key, value in out.items()}


def _same(path: str, name: str) -> Rule:
    return Rule((path,), (name,), lambda x: (x,), lambda w: (w,))


def _reshaped(path: str, name: str, shape: tuple, stored: tuple) -> Rule:
    """A tensor stored as ``stored``, the parameter shaped ``shape``."""
    return Rule((path,), (name,), lambda x: (x.reshape(shape),), lambda w: (w.reshape(stored),))


def _linear(path: str, name: str, shape: tuple | None = None, n_in: int = 1) -> Rule:
    """An ``nn.Linear`` weight ``[out, in]`` as ``[in, out]`` reshaped to ``shape`` (None: as is),
    its first ``n_in`` axes the input (``wo: [heads, head_dim, d_model]``: 2)."""
    return Rule((path,), (name,), lambda x: (x.T if shape is None else x.T.reshape(shape),),
                lambda w: (w.reshape(math.prod(w.shape[:n_in]), -1).T,))


def _gpt2(model_type: str, arch: Mapping[str, Any], vocab_size: int) -> list[Rule]:
    """GPT-2: ``Conv1D`` weights ``[in, out]``, q, k and v fused in ``c_attn``, learned positions."""
    d, heads, _, hd = _heads(arch)
    table = [Rule(("wte/embedding",), (f"{GPT2_PREFIX}wte.weight",), lambda x: (x,), lambda w: (w[:vocab_size],)),
             Rule(("wpe/embedding",), (f"{GPT2_PREFIX}wpe.weight",), lambda x: (x[: arch["seq_len"]],),
                  lambda w: (w,))]  # seq_len may be lowered
    for i in range(arch["n_layers"]):
        p, t = f"{GPT2_PREFIX}h.{i}", f"h_{i}"
        table += [
            Rule(tuple(f"{t}/attn/w{w}" for w in "qkv"), (f"{p}.attn.c_attn.weight",),
                 lambda x: tuple(part.reshape(d, heads, hd) for part in np.split(x, 3, axis=-1)),
                 lambda *ws: (np.concatenate([w.reshape(d, d) for w in ws], axis=1),)),
            Rule(tuple(f"{t}/attn/b{w}" for w in "qkv"), (f"{p}.attn.c_attn.bias",),
                 lambda x: tuple(part.reshape(heads, hd) for part in np.split(x, 3, axis=-1)),
                 lambda *bs: (np.concatenate([b.reshape(d) for b in bs]),)),
            _reshaped(f"{t}/attn/wo", f"{p}.attn.c_proj.weight", (heads, hd, d), (d, d)),
            _same(f"{t}/attn/bo", f"{p}.attn.c_proj.bias"),
            _same(f"{t}/mlp/w_up", f"{p}.mlp.c_fc.weight"),
            _same(f"{t}/mlp/b_up", f"{p}.mlp.c_fc.bias"),
            _same(f"{t}/mlp/w_out", f"{p}.mlp.c_proj.weight"),
            _same(f"{t}/mlp/b_out", f"{p}.mlp.c_proj.bias"),
        ]
        table += [_same(f"{t}/{norm}/{kind}", f"{p}.{norm}.{name}") for norm in ("ln_1", "ln_2")
                  for kind, name in (("scale", "weight"), ("bias", "bias"))]
    return [*table, _same("ln_f/scale", f"{GPT2_PREFIX}ln_f.weight"), _same("ln_f/bias", f"{GPT2_PREFIX}ln_f.bias")]


def _llama(model_type: str, arch: Mapping[str, Any], vocab_size: int) -> list[Rule]:
    """Llama's layout (and its descendants'): ``nn.Linear`` weights ``[out, in]``, RMSNorm scales,
    a SwiGLU (GeGLU) MLP or a mixture of experts; Phi-3's q, k, v and gate, up fused; q/k norms
    (Qwen3, Gemma 3) and norms after attention and MLP (Gemma's) where the architecture has them."""
    d, heads, kv, hd = _heads(arch)
    table = [Rule(("wte/embedding",), ("model.embed_tokens.weight",), lambda x: (x,), lambda w: (w[:vocab_size],))]
    for i in range(arch["n_layers"]):
        p, t = f"model.layers.{i}", f"h_{i}"
        table += [
            *(_fused_qkv(t, p, d, heads, kv, hd) if model_type in FUSED else
              [_linear(f"{t}/attn/w{w}", f"{p}.self_attn.{w}_proj.weight", (d, n, hd))
               for w, n in (("q", heads), ("k", kv), ("v", kv))]),
            _linear(f"{t}/attn/wo", f"{p}.self_attn.o_proj.weight", (heads, hd, d), n_in=2),
            *_mlp(model_type, arch, i, f"{t}/mlp", p),
        ]
        norms = NORM_NAMES[bool(arch.get("post_norms"))]
        table += [_same(f"{t}/{norm}/scale", f"{p}.{name}.weight") for norm, name in norms.items()]
        if arch.get("qk_norm"):
            table += [_same(f"{t}/attn/{w}_norm/scale", f"{p}.self_attn.{w}_norm.weight") for w in "qk"]
        if arch["qkv_bias"]:
            table += [_reshaped(f"{t}/attn/b{w}", f"{p}.self_attn.{w}_proj.bias", (n, hd), (n * hd,))
                      for w, n in (("q", heads), ("k", kv), ("v", kv))]
    return [*table, _same("ln_f/scale", "model.norm.weight")]


# theseus's norms of a block -> their Hugging Face modules: Llama's two, or Gemma's four around
# attention and MLP (where post_attention_layernorm is the attention's output norm, not the MLP's input)
NORM_NAMES = {False: {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm"},
              True: {"ln_1": "input_layernorm", "ln_1_post": "post_attention_layernorm",
                     "ln_2": "pre_feedforward_layernorm", "ln_2_post": "post_feedforward_layernorm"}}
FUSED = ("phi3",)  # the model_types that store q, k, v as one qkv_proj and gate, up as one gate_up_proj


def _fused_qkv(t: str, p: str, d: int, heads: int, kv: int, hd: int) -> list[Rule]:
    """Phi-3's ``qkv_proj: [(heads + 2 kv) x head_dim, d_model]``, q's rows then k's then v's."""
    widths = (heads, kv, kv)
    cuts = np.cumsum([n * hd for n in widths])[:-1]
    return [Rule(tuple(f"{t}/attn/w{w}" for w in "qkv"), (f"{p}.self_attn.qkv_proj.weight",),
                 lambda x: tuple(part.T.reshape(d, n, hd) for part, n in zip(np.split(x, cuts), widths, strict=True)),
                 lambda *ws: (np.concatenate([w.reshape(d, -1).T for w in ws]),))]


def _mlp(model_type: str, arch: Mapping[str, Any], layer: int, t: str, p: str) -> list[Rule]:
    """Layer ``layer``'s feed-forward (params under ``t``): a SwiGLU MLP, or a router ``[d, expert]``,
    experts ``w_gate``, ``w_up: [expert, d, f]``, ``w_out: [expert, f, d]`` and Qwen2-MoE's shared
    expert with its gate ``[d, 1]``."""
    if model_type in FUSED:  # Phi-3's gate_up_proj: [2 x d_ff, d_model], gate's rows first
        return [Rule((f"{t}/w_gate", f"{t}/w_up"), (f"{p}.mlp.gate_up_proj.weight",),
                     lambda x: tuple(part.T for part in np.split(x, 2)), lambda g, u: (np.concatenate([g.T, u.T]),)),
                _linear(f"{t}/w_out", f"{p}.mlp.down_proj.weight")]
    if not _is_moe(model_type, arch, layer):
        return _swiglu(t, f"{p}.mlp")
    module, (gate, up, down) = EXPERTS[model_type]
    experts = [f"{p}.{module}.experts.{j}" for j in range(arch["moe.n_experts"])]
    table = [
        _linear(f"{t}/router", f"{p}.{module}.gate.weight"),
        *(Rule((f"{t}/w_{weight}",), tuple(f"{e}.{name}.weight" for e in experts),
               lambda *xs: (np.stack([x.T for x in xs]),), lambda w: tuple(x.T for x in w))
          for weight, name in (("gate", gate), ("up", up), ("out", down))),
    ]
    if model_type == "qwen2_moe":
        table += [*_swiglu(f"{t}/shared", f"{p}.mlp.shared_expert"),
                  _linear(f"{t}/shared_gate", f"{p}.mlp.shared_expert_gate.weight")]
    return table


def _swiglu(t: str, p: str) -> list[Rule]:
    """A gated MLP's ``gate_proj``, ``up_proj`` and ``down_proj`` under module ``p`` (params under ``t``)."""
    return [_linear(f"{t}/w_{weight}", f"{p}.{name}_proj.weight") for weight, name in
            (("gate", "gate"), ("up", "up"), ("out", "down"))]


TABLES = {"gpt2": _gpt2, **dict.fromkeys(LLAMA_LIKE, _llama)}  # model_type -> its table


class _Reads:
    """A flat param tree that records which parameters were read: a mapping drops none unseen."""

    def __init__(self, params: Params, model_type: str):
        self.params, self.model_type, self.read = params, model_type, set()

    def __getitem__(self, path: str) -> np.ndarray:
        if path not in self.params:
            raise ConfigError(f"the Hugging Face {self.model_type} mapping needs parameter {path}, which the "
                              f"model lacks")
        self.read.add(path)
        return self.params[path]

    def unused(self) -> list[str]:
        return sorted(set(self.params) - self.read)


def save(tensors: Mapping[str, np.ndarray], folder: Path) -> None:
    """Write ``folder/model.safetensors`` (transformers' metadata: PyTorch layout)."""
    write_safetensors(tensors, folder / WEIGHTS_FILE)


def load_hf_gpt2(state_dict: Mapping[str, Any], n_heads: int | None = None,
                 scan_layers: bool = False) -> tuple[dict[str, Any], dict]:
    """``(overrides, params)`` for a Hugging Face GPT2LMHeadModel (or GPT2Model) state dict.

    Values may be numpy arrays or torch tensors. Build the model under the overrides and apply
    the params::

        overrides, params = load_hf_gpt2(hf_model.state_dict())
        with configuration(overrides):
            model = configure(GPT)
        logits = model.apply({"params": params}, tokens)

    A state dict does not record the number of heads: ``n_heads`` defaults to d_model // 64,
    as in every released GPT-2. For a folder on disk, ``trainer.init_from`` reads config.json.
    With ``scan_layers`` the blocks come stacked (``stack_layers``) for ``architecture.scan_layers=true``.
    """
    sd = {key if key.startswith("lm_head.") else GPT2_PREFIX + key.removeprefix(GPT2_PREFIX): _float32(value)
          for key, value in state_dict.items()}
    vocab_size, d_model = sd[GPT2_PREFIX + "wte.weight"].shape
    tied = "lm_head.weight" not in sd or np.array_equal(sd["lm_head.weight"], sd[GPT2_PREFIX + "wte.weight"])
    arch = architecture({
        "model_type": "gpt2", "vocab_size": vocab_size, "n_positions": sd[GPT2_PREFIX + "wpe.weight"].shape[0],
        "n_layer": len({key.split(".")[2] for key in sd if key.startswith(GPT2_PREFIX + "h.")}),
        "n_embd": d_model, "n_head": n_heads or d_model // 64,
        "n_inner": sd[GPT2_PREFIX + "h.0.mlp.c_fc.weight"].shape[1], "tie_word_embeddings": tied,
    }, where="the state dict")
    flat = {path: thunk() for path, thunk in to_theseus("gpt2", arch, sd.__getitem__).items()}
    params = traverse_util.unflatten_dict(flat, sep="/")
    overrides = {f"architecture.{key}": value for key, value in {**arch, "scan_layers": scan_layers}.items()}
    return overrides, stack_layers(params) if scan_layers else params


def _heads(arch: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(d_model, heads, kv_heads, head_dim)."""
    d, heads = arch["d_model"], arch["n_heads"]
    return d, heads, arch["n_kv_heads"] or heads, arch.get("head_dim") or d // heads


def _is_moe(model_type: str, arch: Mapping[str, Any], layer: int) -> bool:
    """Whether layer ``layer`` is a mixture of experts (MoEGPT's ``architecture.moe.every``)."""
    return model_type in EXPERTS and (layer + 1) % arch.get("moe.every", 1) == 0


def _float32(value: Any) -> np.ndarray:
    """A numpy float32 copy of an array or a torch tensor (bfloat16 included)."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32)
