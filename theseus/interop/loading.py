"""A Hugging Face checkpoint's tensors straight onto their shards of the mesh.

    params = load_params(folder, arch, target)  # target: ShapeDtypeStructs with NamedShardings

One parameter at a time: its tensor is read from its safetensors file (memory-mapped),
rearranged into theseus's layout and handed to ``jax.make_array_from_callback``, which asks
for each local device's slice alone. The host holds one parameter, never the model (scanned
layers: one parameter of every layer, stacked); each device receives only its shard, so a
model larger than one device's memory loads under FSDP.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from theseus.config import ConfigError
from theseus.interop.hf_config import architecture, read_config
from theseus.interop.hf_weights import Checkpoint, to_theseus
from theseus.model import lora


def load_params(folder: Path, arch: Mapping[str, Any], target: Mapping, seed: int = 0) -> dict:
    """The params of the checkpoint in ``folder``, laid out as ``target`` (the run's params:
    ShapeDtypeStructs with shardings) and cast to its dtypes; ``arch``: the run's architecture
    values (``hf_config.arch_of(model)``). A scanned model's blocks (``architecture.scan_layers``:
    ``h/...`` with a leading layer axis) stack the checkpoint's layers. LoRA's adapters, which
    the checkpoint does not hold, start fresh (``lora.initial`` from ``seed``: B zero, the base's function).

    ConfigError when a tensor is missing, has another shape, or would be left unused.
    """
    hf = read_config(folder)
    architecture(hf)  # refuses what theseus does not compute
    with Checkpoint(folder) as checkpoint:
        thunks = to_theseus(hf["model_type"], arch, checkpoint.read)
        loaded = {}
        for path, leaf in traverse_util.flatten_dict(target, sep="/").items():
            host = (lora.initial(path, leaf.shape, leaf.dtype, seed) if lora.is_adapter(path)
                    else _read(thunks, path, arch["n_layers"], folder))
            loaded[path] = _place(host, leaf, path, folder)
        tied = {"lm_head.weight"} if arch["tie_embeddings"] else set()  # a tied head some checkpoints store
        unused = [name for name in checkpoint.unused() if name not in tied]
    if unused:
        raise ConfigError(f"{folder}: tensor {unused[0]} (and {len(unused) - 1} more) of the checkpoint has no "
                          f"place in the model: its config.json does not describe these weights")
    return traverse_util.unflatten_dict(loaded, sep="/")


def _read(thunks: Mapping[str, Any], path: str, n_layers: int, folder: Path) -> np.ndarray:
    """The checkpoint's tensor of parameter ``path`` in theseus's layout; for a scanned block's
    ``h/REST``, layer i's ``h_i/REST`` stacked on a leading axis."""
    if path in thunks:
        return thunks[path]()
    block, _, rest = path.partition("/")
    if block == "h" and f"h_0/{rest}" in thunks:
        return np.stack([thunks[f"h_{i}/{rest}"]() for i in range(n_layers)])
    raise ConfigError(f"{folder}: no tensor of the checkpoint maps to parameter {path}")


def _place(host: np.ndarray, leaf: jax.ShapeDtypeStruct, path: str, folder: Path) -> jax.Array:
    """``host`` as a global array with ``leaf``'s shape, dtype and sharding: each local device
    gets its own slice (cast on the way)."""
    if host.shape != leaf.shape:
        raise ConfigError(f"{folder}: parameter {path} is {list(leaf.shape)} in the model but "
                          f"{list(host.shape)} in the checkpoint")
    return jax.make_array_from_callback(leaf.shape, leaf.sharding,
                                        lambda index: np.asarray(host[index], dtype=leaf.dtype))
