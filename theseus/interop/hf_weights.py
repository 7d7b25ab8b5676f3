"""Safetensors tensors <-> theseus's GPT parameter tree, per Hugging Face ``model_type``.

Both directions are exact rearrangements (split, transpose, reshape, concatenate): import then
export gives back every tensor bit for bit. Paths are the unrolled tree (``h_0/attn/wq``); a
stacked (scanned) tree adapts ``to_theseus``/``to_hf`` alone.

Layouts: Hugging Face's ``nn.Linear`` weights are ``[out, in]``, GPT-2's ``Conv1D`` weights
``[in, out]``; theseus's are ``[in, ...out]`` with heads split out (``wq: [d_model, heads,
head_dim]``, ``wo: [heads, head_dim, d_model]``, ``w_in: [n_in, d_model, d_ff]``, gate first).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy: safetensors' numpy reader needs it)
import numpy as np
from flax import traverse_util
from safetensors import safe_open
from safetensors.numpy import save_file

from theseus.config import ConfigError
from theseus.interop.hf_config import architecture
from theseus.model.models.gpt import stack_layers

WEIGHTS_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
IGNORED = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")  # buffers older transformers saved
GPT2_PREFIX = "transformer."
LLAMA_LIKE = ("llama", "qwen2", "mixtral", "qwen2_moe")  # Llama's layout; the last two: mixtures of experts
# each MoE model_type's names: its feed-forward module, then each expert's (gate, up, down) projections
EXPERTS = {"mixtral": ("block_sparse_moe", ("w1", "w3", "w2")),
           "qwen2_moe": ("mlp", ("gate_proj", "up_proj", "down_proj"))}

Read = Callable[[str], np.ndarray]  # a tensor of the checkpoint by its Hugging Face name
Params = dict[str, np.ndarray]  # "h_0/attn/wq" -> array: traverse_util.flatten_dict(params, sep="/")


class Checkpoint:
    """The safetensors files of a Hugging Face folder: one ``model.safetensors`` or shards with
    their ``model.safetensors.index.json``. Reads one tensor at a time (memory-mapped), never pickle.

        with Checkpoint(folder) as ckpt:
            wte = ckpt.read("transformer.wte.weight")  # np.ndarray, the stored dtype
    """

    def __init__(self, folder: Path):
        index, single = folder / INDEX_FILE, folder / WEIGHTS_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (ValueError, KeyError) as exc:
                raise ConfigError(f"{index} has no weight_map ({exc}): save the model again") from exc
            self.files = {name: folder / file for name, file in weight_map.items()}
        elif single.is_file():
            with safe_open(single, "np") as f:
                self.files = dict.fromkeys(f.keys(), single)
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
        self._open: dict[Path, Any] = {}
        self.used: set[str] = set()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._open.values():
            handle.__exit__(None, None, None)
        self._open.clear()

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as stored; ConfigError naming it when the checkpoint lacks it."""
        if name not in self.files:
            raise ConfigError(f"the checkpoint has no tensor {name!r}: it does not match its config.json")
        path = self.files[name]
        if path not in self._open:
            self._open[path] = safe_open(path, "np").__enter__()
        self.used.add(name)
        return self._open[path].get_tensor(name)

    def unused(self) -> list[str]:
        """Tensors no ``read`` asked for, known buffers aside: weights an import would drop."""
        return sorted(name for name in self.files if name not in self.used and not name.endswith(IGNORED))


def to_theseus(model_type: str, arch: Mapping[str, Any], read: Read) -> dict[str, Callable[[], np.ndarray]]:
    """Each theseus param path -> a thunk computing it from the checkpoint (one tensor at a time).

    ``arch``: the run's architecture values (``theseus.interop.hf_config.arch_of``).
    """
    d, heads, kv, hd = _heads(arch)
    out: dict[str, Callable[[], np.ndarray]] = {}
    if model_type == "gpt2":
        def name(key: str) -> str:
            return GPT2_PREFIX + key

        out["wte/embedding"] = lambda: read(name("wte.weight"))
        out["wpe/embedding"] = lambda: read(name("wpe.weight"))[: arch["seq_len"]]  # seq_len may be lowered
        for i in range(arch["n_layers"]):
            p, t = f"h.{i}", f"h_{i}"
            qkv = _gpt2_qkv(read, name(f"{p}.attn.c_attn"), d, heads, hd)
            for j, w in enumerate(("q", "k", "v")):
                out[f"{t}/attn/w{w}"] = functools.partial(qkv, "weight", j)
                out[f"{t}/attn/b{w}"] = functools.partial(qkv, "bias", j)
            out.update({
                f"{t}/attn/wo": _reshaped(read, name(f"{p}.attn.c_proj.weight"), (heads, hd, d)),
                f"{t}/attn/bo": _reshaped(read, name(f"{p}.attn.c_proj.bias"), None),
                f"{t}/mlp/w_in": _reshaped(read, name(f"{p}.mlp.c_fc.weight"), None, stack=True),
                f"{t}/mlp/b_in": _reshaped(read, name(f"{p}.mlp.c_fc.bias"), None, stack=True),
                f"{t}/mlp/w_out": _reshaped(read, name(f"{p}.mlp.c_proj.weight"), None),
                f"{t}/mlp/b_out": _reshaped(read, name(f"{p}.mlp.c_proj.bias"), None),
            })
            for norm in ("ln_1", "ln_2"):
                out[f"{t}/{norm}/scale"] = _reshaped(read, name(f"{p}.{norm}.weight"), None)
                out[f"{t}/{norm}/bias"] = _reshaped(read, name(f"{p}.{norm}.bias"), None)
        out["ln_f/scale"] = _reshaped(read, name("ln_f.weight"), None)
        out["ln_f/bias"] = _reshaped(read, name("ln_f.bias"), None)
        if not arch["tie_embeddings"]:
            out["lm_head"] = _linear(read, "lm_head.weight", None)
        return out
    if model_type in LLAMA_LIKE:
        out["wte/embedding"] = lambda: read("model.embed_tokens.weight")
        for i in range(arch["n_layers"]):
            p, t = f"model.layers.{i}", f"h_{i}"
            out.update({
                f"{t}/ln_1/scale": _reshaped(read, f"{p}.input_layernorm.weight", None),
                f"{t}/attn/wq": _linear(read, f"{p}.self_attn.q_proj.weight", (d, heads, hd)),
                f"{t}/attn/wk": _linear(read, f"{p}.self_attn.k_proj.weight", (d, kv, hd)),
                f"{t}/attn/wv": _linear(read, f"{p}.self_attn.v_proj.weight", (d, kv, hd)),
                f"{t}/attn/wo": _linear(read, f"{p}.self_attn.o_proj.weight", (heads, hd, d)),
                f"{t}/ln_2/scale": _reshaped(read, f"{p}.post_attention_layernorm.weight", None),
            })
            out.update({f"{t}/mlp/{path}": thunk for path, thunk in _mlp_to_theseus(model_type, arch, i, read, p)})
            if arch["qkv_bias"]:
                for w, n in (("q", heads), ("k", kv), ("v", kv)):
                    out[f"{t}/attn/b{w}"] = _reshaped(read, f"{p}.self_attn.{w}_proj.bias", (n, hd))
        out["ln_f/scale"] = _reshaped(read, "model.norm.weight", None)
        if not arch["tie_embeddings"]:
            out["lm_head"] = _linear(read, "lm_head.weight", None)
        return out
    raise ConfigError(f"model_type {model_type!r} has no weight mapping ({', '.join(('gpt2', *LLAMA_LIKE))})")


def to_hf(model_type: str, arch: Mapping[str, Any], params: Params, vocab_size: int) -> dict[str, np.ndarray]:
    """The Hugging Face tensors of a flat param tree, the inverse of ``to_theseus``; the
    vocabulary is cut to its first ``vocab_size`` rows (the trainer's padding removed).
    ConfigError when the mapping needs a parameter the tree lacks, or leaves one unused."""
    d, heads, kv, hd = _heads(arch)
    params = _Reads(params, model_type)
    wte = params["wte/embedding"][:vocab_size]
    out: dict[str, np.ndarray] = {}
    if model_type == "gpt2":
        out["wte.weight"], out["wpe.weight"] = wte, params["wpe/embedding"]
        for i in range(arch["n_layers"]):
            p, t = f"h.{i}", f"h_{i}"
            qkv = [params[f"{t}/attn/w{w}"].reshape(d, d) for w in "qkv"]
            out.update({
                f"{p}.attn.c_attn.weight": np.concatenate(qkv, axis=1),
                f"{p}.attn.c_attn.bias": np.concatenate([params[f"{t}/attn/b{w}"].reshape(d) for w in "qkv"]),
                f"{p}.attn.c_proj.weight": params[f"{t}/attn/wo"].reshape(d, d),
                f"{p}.attn.c_proj.bias": params[f"{t}/attn/bo"],
                f"{p}.mlp.c_fc.weight": params[f"{t}/mlp/w_in"][0], f"{p}.mlp.c_fc.bias": params[f"{t}/mlp/b_in"][0],
                f"{p}.mlp.c_proj.weight": params[f"{t}/mlp/w_out"], f"{p}.mlp.c_proj.bias": params[f"{t}/mlp/b_out"],
            })
            for norm in ("ln_1", "ln_2"):
                out[f"{p}.{norm}.weight"], out[f"{p}.{norm}.bias"] = (params[f"{t}/{norm}/scale"],
                                                                      params[f"{t}/{norm}/bias"])
        out["ln_f.weight"], out["ln_f.bias"] = params["ln_f/scale"], params["ln_f/bias"]
        out = {GPT2_PREFIX + key: value for key, value in out.items()}
    elif model_type in LLAMA_LIKE:
        out["model.embed_tokens.weight"] = wte
        for i in range(arch["n_layers"]):
            p, t = f"model.layers.{i}", f"h_{i}"
            out.update({
                f"{p}.input_layernorm.weight": params[f"{t}/ln_1/scale"],
                f"{p}.self_attn.q_proj.weight": params[f"{t}/attn/wq"].reshape(d, heads * hd).T,
                f"{p}.self_attn.k_proj.weight": params[f"{t}/attn/wk"].reshape(d, kv * hd).T,
                f"{p}.self_attn.v_proj.weight": params[f"{t}/attn/wv"].reshape(d, kv * hd).T,
                f"{p}.self_attn.o_proj.weight": params[f"{t}/attn/wo"].reshape(heads * hd, d).T,
                f"{p}.post_attention_layernorm.weight": params[f"{t}/ln_2/scale"],
            })
            out.update(_mlp_to_hf(model_type, arch, i, lambda path, t=t: params[f"{t}/mlp/{path}"], p))
            if arch["qkv_bias"]:
                out.update({f"{p}.self_attn.{w}_proj.bias": params[f"{t}/attn/b{w}"].reshape(-1) for w in "qkv"})
        out["model.norm.weight"] = params["ln_f/scale"]
    else:
        raise ConfigError(f"model_type {model_type!r} has no weight mapping ({', '.join(('gpt2', *LLAMA_LIKE))})")
    if not arch["tie_embeddings"]:
        out["lm_head.weight"] = params["lm_head"][:, :vocab_size].T
    unused = params.unused()
    if unused:
        raise ConfigError(f"parameter {unused[0]} (and {len(unused) - 1} more) has no place in a Hugging Face "
                          f"{model_type} checkpoint")
    return {key: np.ascontiguousarray(value) for key, value in out.items()}


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
    save_file(dict(tensors), str(folder / WEIGHTS_FILE), metadata={"format": "pt"})


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
    return d, heads, arch["n_kv_heads"] or heads, d // heads


def _reshaped(read: Read, name: str, shape: tuple | None, stack: bool = False) -> Callable[[], np.ndarray]:
    """A thunk: tensor ``name`` as stored, reshaped to ``shape`` (None: as is), with a leading
    axis of 1 when ``stack`` (GELU's one input projection in ``w_in: [1, d, d_ff]``)."""
    def thunk() -> np.ndarray:
        x = read(name)
        x = x if shape is None else x.reshape(shape)
        return x[None] if stack else x
    return thunk


def _linear(read: Read, name: str, shape: tuple | None) -> Callable[[], np.ndarray]:
    """A thunk: an ``nn.Linear`` weight ``[out, in]`` as ``[in, out]``, reshaped to ``shape``."""
    def thunk() -> np.ndarray:
        x = read(name).T
        return x if shape is None else x.reshape(shape)
    return thunk


def _gate_up(read: Read, prefix: str, gate: str, up: str) -> Callable[[], np.ndarray]:
    """A thunk: SwiGLU's ``w_in: [2, d_model, d_ff]``, gate then up (each ``[d_ff, d_model]`` stored)."""
    return lambda: np.stack([read(f"{prefix}.{gate}.weight").T, read(f"{prefix}.{up}.weight").T])


def _is_moe(model_type: str, arch: Mapping[str, Any], layer: int) -> bool:
    """Whether layer ``layer`` is a mixture of experts (MoEGPT's ``architecture.moe.every``)."""
    return model_type in EXPERTS and (layer + 1) % arch.get("moe.every", 1) == 0


def _mlp_to_theseus(model_type: str, arch: Mapping[str, Any], layer: int, read: Read,
                    p: str) -> list[tuple[str, Callable[[], np.ndarray]]]:
    """Layer ``layer``'s feed-forward params (paths under ``h_i/mlp/``) as thunks: a SwiGLU MLP,
    or a router ``[d, expert]``, experts ``w_in: [2, expert, d, f]``, ``w_out: [expert, f, d]``
    and Qwen2-MoE's shared expert with its gate ``[d, 1]``."""
    if not _is_moe(model_type, arch, layer):
        return [("w_in", _gate_up(read, f"{p}.mlp", "gate_proj", "up_proj")),
                ("w_out", _linear(read, f"{p}.mlp.down_proj.weight", None))]
    module, (gate, up, down) = EXPERTS[model_type]
    experts = [f"{p}.{module}.experts.{j}" for j in range(arch["moe.n_experts"])]
    out = [("router", _linear(read, f"{p}.{module}.gate.weight", None)),
           ("w_in", lambda: np.stack([_gate_up(read, e, gate, up)() for e in experts], axis=1)),
           ("w_out", lambda: np.stack([read(f"{e}.{down}.weight").T for e in experts]))]
    if model_type == "qwen2_moe":
        out += [("shared/w_in", _gate_up(read, f"{p}.mlp.shared_expert", "gate_proj", "up_proj")),
                ("shared/w_out", _linear(read, f"{p}.mlp.shared_expert.down_proj.weight", None)),
                ("shared_gate", _linear(read, f"{p}.mlp.shared_expert_gate.weight", None))]
    return out


def _mlp_to_hf(model_type: str, arch: Mapping[str, Any], layer: int, param: Callable[[str], np.ndarray],
               p: str) -> dict[str, np.ndarray]:
    """The inverse of ``_mlp_to_theseus``: ``param(path)`` reads ``h_i/mlp/path``."""
    if not _is_moe(model_type, arch, layer):
        w_in = param("w_in")
        return {f"{p}.mlp.gate_proj.weight": w_in[0].T, f"{p}.mlp.up_proj.weight": w_in[1].T,
                f"{p}.mlp.down_proj.weight": param("w_out").T}
    module, (gate, up, down) = EXPERTS[model_type]
    w_in, w_out = param("w_in"), param("w_out")
    out = {f"{p}.{module}.gate.weight": param("router").T}
    for j in range(arch["moe.n_experts"]):
        e = f"{p}.{module}.experts.{j}"
        out.update({f"{e}.{gate}.weight": w_in[0, j].T, f"{e}.{up}.weight": w_in[1, j].T,
                    f"{e}.{down}.weight": w_out[j].T})
    if model_type == "qwen2_moe":
        shared = param("shared/w_in")
        out.update({f"{p}.mlp.shared_expert.gate_proj.weight": shared[0].T,
                    f"{p}.mlp.shared_expert.up_proj.weight": shared[1].T,
                    f"{p}.mlp.shared_expert.down_proj.weight": param("shared/w_out").T,
                    f"{p}.mlp.shared_expert_gate.weight": param("shared_gate").T})
    return out


def _gpt2_qkv(read: Read, prefix: str, d: int, heads: int, hd: int) -> Callable[[str, int], np.ndarray]:
    """``(kind, j)`` -> the j-th of q, k, v in GPT-2's fused ``c_attn`` (weight ``[d, 3d]`` or bias
    ``[3d]``), as ``[d, heads, head_dim]`` or ``[heads, head_dim]``."""
    def part(kind: str, j: int) -> np.ndarray:
        x = np.split(read(f"{prefix}.{kind}"), 3, axis=-1)[j]
        return x.reshape((d, heads, hd) if kind == "weight" else (heads, hd))
    return part


def _float32(value: Any) -> np.ndarray:
    """A numpy float32 copy of an array or a torch tensor (bfloat16 included)."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32)
