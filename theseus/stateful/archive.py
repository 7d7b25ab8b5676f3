"""A saved Model's tree as JSON plus separate ``.npy`` arrays: nothing is pickled, so loading
executes nothing from the file."""

from __future__ import annotations

import zipfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def encode(tree: Any, arrays: list[np.ndarray]) -> Any:
    """``tree`` as JSON, each array replaced by ``{"__array__": i, "dtype": ...}`` (appended to
    ``arrays``) and each tuple by ``{"__tuple__": [...]}``."""
    if isinstance(tree, dict):
        if not all(isinstance(key, str) for key in tree):
            raise TypeError(f"cannot save a dict with non-string keys: {list(tree)}")
        return {key: encode(value, arrays) for key, value in tree.items()}
    if isinstance(tree, tuple):
        return {"__tuple__": [encode(value, arrays) for value in tree]}
    if isinstance(tree, list):
        return [encode(value, arrays) for value in tree]
    if isinstance(tree, np.ndarray | np.generic | jax.Array):
        array = np.asarray(tree)
        if array.dtype.hasobject:
            raise TypeError("cannot save an array of Python objects")
        arrays.append(array)
        return {"__array__": len(arrays) - 1, "dtype": array.dtype.name}
    if tree is None or isinstance(tree, bool | int | float | str):
        return tree
    raise TypeError(f"cannot save a {type(tree).__name__}: hyperparameters must be basic types or arrays")


def decode(tree: Any, archive: zipfile.ZipFile) -> Any:
    """The inverse of ``encode``, reading arrays from ``archive`` (pickle refused)."""
    if isinstance(tree, list):
        return [decode(value, archive) for value in tree]
    if not isinstance(tree, dict):
        return tree
    if set(tree) == {"__tuple__"}:
        return tuple(decode(value, archive) for value in tree["__tuple__"])
    if set(tree) == {"__array__", "dtype"}:
        with archive.open(f"arrays/{int(tree['__array__'])}.npy") as f:
            array = np.lib.format.read_array(f, allow_pickle=False)
        dtype = np.dtype(jnp.dtype(str(tree["dtype"])))  # e.g. bfloat16, which .npy stores as raw bytes
        return array if array.dtype == dtype else array.view(dtype)
    return {key: decode(value, archive) for key, value in tree.items()}
