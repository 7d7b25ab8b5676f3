"""JAX's persistent compilation cache, where theseus keeps it."""

from __future__ import annotations

import jax

from theseus.base.hardware import CACHE


def use_compilation_cache() -> None:
    """Keep compiled programs across processes in JAX's persistent cache (~/.cache/theseus/jax),
    unless JAX_COMPILATION_CACHE_DIR names another place: a command run again starts without
    compiling (a run's steps, a sampler's prefill and decode)."""
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str(CACHE.parent / "jax"))
