"""JAX's persistent compilation cache, where theseus keeps it."""

from __future__ import annotations

import os

import jax

from theseus.base.hardware import CACHE


def use_compilation_cache() -> None:
    """Keep compiled programs across processes in JAX's persistent cache (~/.cache/theseus/jax),
    unless JAX_COMPILATION_CACHE_DIR names another place: a command run again starts without
    compiling (a run's steps, a sampler's prefill and decode). Every program is kept, not only
    those that took a second (JAX's default): a command's small ones (its parameters' init, its
    evaluation, its checkpoint's transfers) take seconds together on a CPU, and milliseconds to
    read back. JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS sets another threshold."""
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str(CACHE.parent / "jax"))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
