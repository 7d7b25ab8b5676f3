"""Resume safety: a run directory continues only under the config it was trained with.

Changes that would alter shapes, the data order or the optimizer are refused with the diff;
changes that only affect logging, evaluations and their cadence, checkpoint cadence or the
device layout (restoring onto another mesh is supported) pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from theseus.config import ConfigError

SAFE = (
    "logger.", "mesh.", "distributed.", "evaluation.", "data.cache_dir", "trainer.log_every", "trainer.eval_every",
    "trainer.eval_batches", "trainer.checkpoint_every", "trainer.keep_checkpoints", "trainer.resume",
    "trainer.dry_run", "trainer.peak_flops", "trainer.profile_steps",
    "architecture.remat",  # the same numbers, another memory/compute trade (scan_layers changes the tree)
)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def unsafe_changes(saved: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, new value)`` for every change a resume cannot honour.

    ``trainer.max_steps`` may change (a run extended or cut short) when the learning rate does
    not depend on it: a constant schedule whose warmup ends before both.
    """
    old, cur = flatten(saved), flatten(new)
    safe = SAFE
    warmup = cur.get("optimizer.warmup_steps", 0)
    if cur.get("optimizer.schedule") == "constant" and warmup <= min(old.get("trainer.max_steps", 0),
                                                                      cur.get("trainer.max_steps", 0)):
        safe = (*SAFE, "trainer.max_steps")
    keys = sorted(set(old) | set(cur))
    return [(k, old.get(k), cur.get(k)) for k in keys if old.get(k) != cur.get(k) and not k.startswith(safe)]


def check_resume(run_dir: Any, saved: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """ConfigError listing the unsafe changes between the saved config and the new one."""
    changes = unsafe_changes(saved, new)
    if changes:
        diff = ", ".join(f"{key}: {old!r} -> {cur!r}" for key, old, cur in changes)
        raise ConfigError(f"cannot resume {run_dir} with a changed config ({diff}): these alter shapes, data "
                          f"order or the optimizer; revert them, or use a new hydra.run.dir")
