"""Any model source's weights, named by its path, on a params layout's shards.

    params = load_params("~/models/my-llama", arch, target)   # target: ShapeDtypeStructs with NamedShardings
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.sources.model_source import ModelSource
from theseus.sources.parse import parse_source


def load_params(source: ModelSource | str | Path, arch: Mapping[str, Any], target: Mapping, seed: int = 0) -> dict:
    """The params of the model ``source`` names (a ModelSource, or a path to one), laid out as
    ``target`` (the run's params: ShapeDtypeStructs with shardings) and cast to its dtypes;
    ``arch``: the run's architecture values (``hf_config.arch_of(model)``). A theseus checkpoint
    gives the arrays ``target`` names; a Hugging Face folder's or GGUF file's tensors are
    rearranged into theseus's layout. LoRA's adapters, which they do not hold, start fresh
    (``lora.initial`` from ``seed``: B zero, the base's function).

    ConfigError when a tensor is missing, has another shape, or would be left unused.
    """
    source = source if isinstance(source, ModelSource) else parse_source(source, key=None)
    return source.load_params(arch, target, seed)
