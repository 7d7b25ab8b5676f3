"""theseus: a Hydra-driven experiment framework for training JAX/Flax models.

The Python API beside the command line (imported on first use, so ``import theseus`` is light)::

    import theseus
    cfg = theseus.compose(["+experiment=gpt_tiny", "optimizer.lr=1e-3"])  # checked like the CLI
    model = theseus.build_model(cfg, vocab_size=256)                       # a configured Flax module
    val_loss = theseus.train(cfg, "outputs/notebook")                       # or train(overrides, dir)
"""

from __future__ import annotations

import importlib

from theseus.base import command_exit  # noqa: F401 (first: its exit handler then runs after every other)
from theseus.base.dependencies import require_dependencies
from theseus.base.host_allocator import restart_with_huge_pages
from theseus.base.native_output import quiet_cuda_plugin
from theseus.base.platforms import cpu_only_platforms

require_dependencies()  # a Python without them (the environment not active): one line, exit 2, no traceback
# Every entry point imports this first: before anything imports jax, the plan extra's plugins say nothing
# on a machine without their hardware (no CUDA driver lines; no CUDA or TPU backend started on a CPU host)
quiet_cuda_plugin()
cpu_only_platforms()
restart_with_huge_pages()  # a command on a CPU host: XLA's scratch memory, faulted in afresh each step, in 2 MiB pages

__version__ = "0.1.0"

_API = {
    "compose": "theseus.config.compose",
    "configure": "theseus.config",
    "configuration": "theseus.config",
    "field": "theseus.config",
    "register": "theseus.config",
    "ConfigError": "theseus.config",
    "build_model": "theseus.config.registry",
    "train": "theseus.run",
}
__all__ = [*_API, "__version__"]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'theseus' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)
