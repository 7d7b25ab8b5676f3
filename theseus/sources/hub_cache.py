"""The local Hugging Face hub cache, where a model id (``HuggingFaceTB/SmolLM2-135M-Instruct``)
is found offline, as transformers finds it with ``HF_HUB_OFFLINE=1``: its snapshot that
``refs/main`` names.

    folder = hub_snapshot("HuggingFaceTB/SmolLM2-135M-Instruct", named)   # ConfigError when not there
"""

from __future__ import annotations

import os
from pathlib import Path

from theseus.config import ConfigError
from theseus.interop.hf_config import CONFIG_FILE
from theseus.sources.model_source import TAKES


def hub_cache() -> Path:
    """The Hugging Face hub cache, where huggingface_hub puts it: ``HF_HUB_CACHE``, else
    ``HF_HOME/hub``, else ``XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_repo(model_id: str) -> Path:
    """Where the hub cache keeps ``model_id`` (``models--ORG--NAME``), whether or not it is there."""
    return hub_cache() / f"models--{model_id.replace('/', '--')}"


def hub_snapshot(model_id: str, named: str) -> Path:
    """The folder of ``model_id``'s snapshot in the hub cache (its ``refs/main``, else its only
    snapshot); ConfigError, saying how to download it, when it is not there."""
    repo = hub_repo(model_id)
    ref = repo / "refs" / "main"
    snapshots = sorted((repo / "snapshots").iterdir()) if (repo / "snapshots").is_dir() else []
    if ref.is_file():
        folder = repo / "snapshots" / ref.read_text(encoding="utf-8").strip()
    elif len(snapshots) == 1:
        folder = snapshots[0]
    else:
        raise ConfigError(f"{named} is no local path, and {model_id} is not in the Hugging Face cache "
                          f"({hub_cache()}): download it where there is a network (hf download {model_id}) "
                          f"or give {TAKES}")
    if not (folder / CONFIG_FILE).is_file():
        raise ConfigError(f"{named}: its snapshot in the Hugging Face cache ({folder}) has no "
                          f"{CONFIG_FILE}: download the whole model (hf download {model_id})")
    return folder
