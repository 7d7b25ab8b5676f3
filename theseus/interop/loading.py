"""Tensors under Hugging Face's names (a folder's safetensors, a GGUF file's) straight onto
their shards of the mesh, in theseus's layout.

    with tensors:
        params = onto_layout(hf, tensors, arch, target, name, where)  # target: ShapeDtypeStructs with NamedShardings

One parameter at a time: its tensor is read (memory-mapped safetensors, or dequantised from the
GGUF file), rearranged into theseus's layout and handed to ``jax.make_array_from_callback``,
which asks for each local device's slice alone. The host holds one parameter, never the model
(scanned layers: one parameter of every layer, stacked); each device receives only its shard,
so a model larger than one device's memory loads under FSDP. (A theseus checkpoint's params are
read by Orbax: ``theseus.sources.checkpoint_reader``.)
"""

from __future__ import annotations

import mmap
from collections.abc import Mapping
from typing import Any, Protocol

import jax
import numpy as np
from flax import traverse_util

from theseus.config import ConfigError
from theseus.interop.hf_weights import to_theseus
from theseus.model import lora


class Tensors(Protocol):
    """A reader of tensors by their Hugging Face names (``hf_weights.Checkpoint``, ``gguf.Tensors``)."""

    def read(self, name: str) -> np.ndarray: ...

    def unused(self) -> list[str]: ...


def onto_layout(hf: Mapping[str, Any], tensors: Tensors, arch: Mapping[str, Any], target: Mapping, name: str,
                where: str, seed: int = 0) -> dict:
    """The params that ``tensors`` (an open reader of the model ``hf``, its config.json's dict,
    describes) hold, laid out as ``target`` (the run's params: ShapeDtypeStructs with shardings)
    and cast to its dtypes; ``arch``: the run's architecture values (``hf_config.arch_of(model)``).
    A scanned model's blocks (``architecture.scan_layers``: ``h/...`` with a leading layer axis)
    stack their layers. LoRA's adapters, which they do not hold, start fresh (``lora.initial``
    from ``seed``: B zero, the base's function). ``name``: the model as given, for messages;
    ``where``: the file of its config.

    ConfigError when a tensor is missing, has another shape, or would be left unused.
    """
    thunks = to_theseus(hf["model_type"], arch, tensors.read)
    loaded = {}
    for path, leaf in traverse_util.flatten_dict(target, sep="/").items():
        host = (lora.initial(path, leaf.shape, leaf.dtype, seed) if lora.is_adapter(path)
                else _read(thunks, path, arch["n_layers"], name, where))
        loaded[path] = _place(host, leaf, path, name)
    tied = {"lm_head.weight"} if arch["tie_embeddings"] else set()  # a tied head some checkpoints store
    unused = [tensor for tensor in tensors.unused() if tensor not in tied]
    if unused:
        raise ConfigError(f"{name}: tensor {unused[0]} (and {len(unused) - 1} more) of the checkpoint has no "
                          f"place in the model: its config does not describe these weights")
    return traverse_util.unflatten_dict(loaded, sep="/")


def _read(thunks: Mapping[str, Any], path: str, n_layers: int, name: str, where: str) -> np.ndarray:
    """The checkpoint's tensor of parameter ``path`` in theseus's layout; for a scanned block's
    ``h/REST``, layer i's ``h_i/REST`` stacked on a leading axis."""
    block, _, rest = path.partition("/")
    try:
        if path in thunks:
            return thunks[path]()
        if block == "h" and f"h_0/{rest}" in thunks:
            return np.stack([thunks[f"h_{i}/{rest}"]() for i in range(n_layers)])
    except ValueError as exc:  # a tensor that its config's shapes do not fit (numpy cannot reshape it)
        raise ConfigError(f"{name}: the checkpoint's tensors of parameter {path} do not have the shapes its "
                          f"config gives ({exc}): fix {where}, or give the weights it describes") from exc
    raise ConfigError(f"{name}: no tensor of the checkpoint maps to parameter {path}")


def _place(host: np.ndarray, leaf: jax.ShapeDtypeStruct, path: str, name: str) -> jax.Array:
    """``host`` as a global array with ``leaf``'s shape, dtype and sharding: each local device
    gets its own slice (cast on the way). A replicated parameter is copied once, into aligned
    memory, which a CPU's devices all read in place (JAX aliases an aligned host array where
    the device is the host; a donated buffer is not written through)."""
    if host.shape != leaf.shape:
        raise ConfigError(f"{name}: parameter {path} is {list(leaf.shape)} in the model but "
                          f"{list(host.shape)} in the checkpoint")
    if leaf.sharding.is_fully_replicated:
        host = _aligned_copy(host, leaf.dtype)
    return jax.make_array_from_callback(leaf.shape, leaf.sharding,
                                        lambda index: np.asarray(host[index], dtype=leaf.dtype))


def _aligned_copy(host: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``host`` cast to ``dtype``, C-ordered, in fresh page-aligned memory: an anonymous map of
    its own, which the copy faults in 4 KiB at a time (malloc's memory, under theseus's
    ``glibc.malloc.hugetlb``, would be huge pages the kernel compacts memory for: twice as slow)."""
    out = np.frombuffer(mmap.mmap(-1, max(host.size * np.dtype(dtype).itemsize, 1)), dtype, host.size)
    np.copyto(out.reshape(host.shape), host, casting="unsafe")
    return out.reshape(host.shape)
