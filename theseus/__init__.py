"""theseus: a Hydra-driven experiment framework for training JAX/Flax models.

The Python API beside the command line (imported on first use, so ``import theseus`` is light)::

    import theseus
    cfg = theseus.compose(["+experiment=gpt_tiny", "optimizer.lr=1e-3"])  # checked like the CLI
    model = theseus.build_model(cfg, vocab_size=256)                       # a configured Flax module
    val_loss = theseus.train(cfg, "outputs/notebook")                       # or train(overrides, dir)

What ``import theseus`` does to the process, here and only here (every command, every job and a
notebook import this package first, before anything imports jax):

- registers the exit handler of ``theseus.cli.command_exit`` first, so that it runs last; it acts
  only in a process that a command's ``exit_after`` ends (it then skips Python's teardown);
- ``quiet_cuda_plugin``: on a machine without an NVIDIA driver, the CUDA plugin's driver lines are
  dropped;
- ``cpu_only_platforms``: on a host with neither a GPU nor a TPU, sets ``JAX_PLATFORMS=cpu``
  (unless set), so that no TPU or CUDA backend is tried;
- ``restart_with_huge_pages``: a theseus command (``python -m theseus...``, the ``theseus``
  script; never a user's own process) on a CPU host starts again at once, ``os.execve`` of its
  own command line, with glibc's huge pages for ``malloc`` (``theseus.base.host_allocator``).
"""

from __future__ import annotations

import importlib

from theseus.cli import command_exit  # noqa: F401 (first: its exit handler then runs after every other)
from theseus.base.dependencies import require_dependencies
from theseus.base.host_allocator import restart_with_huge_pages
from theseus.base.native_output import quiet_cuda_plugin
from theseus.base.platforms import cpu_only_platforms

# These imports are the standard library's alone: what follows runs before anything heavy is imported.
require_dependencies()  # a Python without them (the environment not active): one line, exit 2, no traceback
# Before anything imports jax: the plan extra's plugins say nothing on a machine without their hardware
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
    "train": "theseus.cli.run",
}
__all__ = [*_API, "__version__"]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'theseus' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)
