"""``python -m theseus.run +experiment=NAME [key=value ...]``: compose, check, train.

Every job's config is composed and resolved before Hydra creates a run directory: a
misspelt key, a wrong type, an impossible shape, mesh or batch fails in one line with
nothing written. ``trainer.dry_run=true`` compiles and reports, then exits, also writing nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict

from theseus.base.devices import claim_devices
from theseus.base.distributed import initialize
from theseus.config import ConfigError
from theseus.config.compose import CONF, compose
from theseus.config.registry import model_class

INFO_FLAGS = {"--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--resolve", "-p", "--package"}
USAGE = """usage: python -m theseus.run [+experiment=NAME] [KEY=VALUE ...]          train
       python -m theseus.run -m +experiment=NAME [+sweep=NAME | KEY=A,B ...]  sweep
       python -m theseus.run ... --cfg job                                   print the composed config
       python -m theseus.run --hydra-help                                    Hydra's own flags

Choices (GROUP=OPTION, +experiment=NAME, +sweep=NAME):
{choices}

Keys (KEY=VALUE; every one is a field() in the code):
{listing}
"""


def usage() -> str:
    """The ``--help`` text: groups, experiments, sweeps and every derived key."""
    from theseus.config.listing import choices, listing

    return USAGE.format(choices=choices(), listing=listing())


def job_overrides(argv: list[str]) -> list[list[str]]:
    """The overrides of each job that ``argv`` asks for (several with ``-m``)."""
    overrides = [arg for arg in argv if not arg.startswith("-") and ("=" in arg or arg.startswith("~"))]
    if not {"-m", "--multirun"} & set(argv):
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:  # a sweeper's own syntax (optuna's interval(...)): check the plain keys
        return [[o for o in overrides if "(" not in o]]


def preflight(argv: list[str]) -> bool:
    """Compose and resolve every job ``argv`` describes; ConfigError on the first mistake.

    Returns False when there is nothing left for Hydra to do (a dry run has been done).
    """
    from theseus.training.trainer import Trainer

    if INFO_FLAGS & set(argv):
        compose(job_overrides(argv)[0])
        return True
    multirun = bool({"-m", "--multirun"} & set(argv))
    remote = any(arg.startswith("hydra/launcher=submitit") for arg in argv)  # other machines, other devices
    trainers = []
    for overrides in job_overrides(argv):
        cfg = compose(overrides, hydra=True)
        run_dir = Path(cfg.hydra.run.dir)
        with open_dict(cfg):
            del cfg["hydra"]
        if remote or hasattr(model_class(cfg), "run"):  # checked where it runs, or a task of its own
            continue
        trainer = Trainer(cfg)
        if not multirun:
            trainer.check_run_dir(run_dir)
        trainers.append(trainer)
    if trainers and all(t.settings.dry_run for t in trainers):
        for trainer in trainers:
            trainer.dry_run()
        return False
    return True


class JobFailed(CompactHydraException):
    """A sweep job's ConfigError or TrainingError, as ``TrainingError: message``: Hydra records
    the job as failed, runs the others, then prints this line instead of a traceback."""


def _task(cfg: DictConfig) -> float:
    """Hydra's task in the job's output directory; returns the objective (the final val loss).

    A model option may bring its own task as a classmethod ``run(cfg, run_dir) -> float``;
    otherwise the language-model trainer trains it.
    """
    from theseus.training.trainer import Trainer, TrainingError

    initialize(cfg)  # a no-op when main() has joined already; launchers such as submitit call here first
    hydra_config = HydraConfig.get()
    run_dir = Path(hydra_config.runtime.output_dir)
    own = getattr(model_class(cfg), "run", None)
    try:
        claim_devices(hydra_config)  # parallel jobs on one host: each its own GPUs, before JAX starts
        return own(cfg, run_dir) if own else Trainer(cfg).run(run_dir)
    except (ConfigError, TrainingError) as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if hydra_config.mode == RunMode.MULTIRUN:
            raise JobFailed(f"{type(exc).__name__}: {exc}") from exc
        print(f"theseus: error: {exc}", file=sys.stderr)
        sys.exit(1)


def use_compilation_cache() -> None:
    """Keep compiled programs across runs in JAX's persistent cache (~/.cache/theseus/jax), unless
    JAX_COMPILATION_CACHE_DIR names another place: a job run again starts without compiling."""
    import jax

    from theseus.base.hardware import CACHE

    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str(CACHE.parent / "jax"))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if {"--help", "-h"} & set(argv):
        print(usage(), end="")
        return
    use_compilation_cache()
    try:
        if not INFO_FLAGS & set(argv):  # join the job before anything touches a device
            initialize(compose(job_overrides(argv)[0]))
        proceed = preflight(argv)
    except ConfigError as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"theseus: error: {exc}", file=sys.stderr)
        sys.exit(2)
    if proceed:
        hydra.main(config_path=str(CONF), config_name="config", version_base=None)(_task)()


if __name__ == "__main__":
    main()
