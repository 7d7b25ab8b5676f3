"""``python -m theseus.run +experiment=NAME [key=value ...]``: compose, check, train.

Every job's config is composed and resolved before Hydra creates a run directory: a
misspelt key (on the command line, in an experiment or a sweep file), a wrong type, an
impossible shape, mesh or batch fails in one line with nothing written.
``trainer.dry_run=true`` compiles and reports, then exits, also writing nothing. A single
run is composed once: Hydra runs that composition (``run_composed``); a sweep's jobs are
composed again by Hydra's sweeper, each checked again by its task function.

From Python, ``train(overrides_or_cfg, run_dir)`` runs one job with the same checks.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from theseus.base.devices import check_enough, claim_devices, parallel_jobs, visible_gpus
from theseus.base.distributed import initialize
from theseus.base.line_prefix import prefixed_output
from theseus.cli.hydra_checks import check_hydra, submits
from theseus.config import ConfigError, configured
from theseus.config.compose import compose, conf_dir, validate
from theseus.config.context import is_checked
from theseus.config.registry import load
from theseus.training.preemption import BeforeStart
from theseus.training.resume import continue_last

# Hydra's flags that print instead of running; the value after each of VALUED is not an override
INFO_FLAGS = {"--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--resolve", "-p", "--package"}
VALUED = {"--cfg", "-c", "--shell-completion", "-sc", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
          "--config-dir", "-cd", "--experimental-rerun"}
INFO_VALUES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}  # what --info may be followed by
OPTIONAL_VALUE = {"--info": INFO_VALUES, "-i": INFO_VALUES}  # flags whose value is optional, and its choices
USAGE = """usage: python -m theseus.run [+experiment=NAME] [KEY=VALUE ...]          train
       python -m theseus.run -m +experiment=NAME [+sweep=NAME | KEY=A,B ...]  sweep
       python -m theseus.run ... --cfg job                                   print the composed config
       python -m theseus.run -sc install=bash                                shell completion
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


def _positions(argv: Sequence[str]) -> list[int]:
    """The positions in ``argv`` of its words that are not flags or a flag's value."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip or arg in VALUED:
            skip = not skip and arg in VALUED
            continue
        optional = i > 0 and argv[i - 1] in OPTIONAL_VALUE and arg in OPTIONAL_VALUE[argv[i - 1]]
        if not arg.startswith("-") and not optional:
            out.append(i)
    return out


def _arguments(argv: Sequence[str]) -> list[str]:
    """The words of ``argv`` that are not flags or a flag's value."""
    return [argv[i] for i in _positions(argv)]


def _is_override(word: str) -> bool:
    return "=" in word or word.startswith("~")


def overrides_of(argv: Sequence[str]) -> list[str]:
    """The ``KEY=VALUE`` (and ``~KEY``) overrides in ``argv``, without flags and their values."""
    return [arg for arg in _arguments(argv) if _is_override(arg)]


def beside_overrides(argv: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``argv`` with the overrides ``extra`` right after its last override (at its end without
    one): Hydra reads the overrides as one run of words, and a word after a flag
    (``... --cfg job model=gpt``) would be refused."""
    last = max((i for i in _positions(argv) if _is_override(argv[i])), default=len(argv) - 1)
    return [*argv[:last + 1], *extra, *argv[last + 1:]]


def derived_overrides(composed: DictConfig) -> list[str]:
    """The overrides that lay over ``composed`` (a job's, with its ``hydra`` node) what its run
    derives before reading data: trainer.init_from's architecture, the vocabulary (``--cfg``
    prints the config that will run)."""
    from theseus.config.overrides import cli_value
    from theseus.config.schema import flatten
    from theseus.recipe import derived_before_data
    from theseus.tasks.task import JobTask, task_class

    cfg = _job(composed)[0]
    if issubclass(task_class(cfg), JobTask):  # it builds its own models
        return []
    given = flatten(OmegaConf.to_container(cfg, resolve=True))
    return [f"{key}={cli_value(value)}" for key, value in derived_before_data(cfg).items() if given.get(key) != value]


def check_words(argv: Sequence[str]) -> None:
    """A word of ``argv`` that is neither a flag nor ``KEY=VALUE`` (``theseus run gpt_tiny``) is
    a ConfigError suggesting the choice it looks like (``+experiment=gpt_tiny``)."""
    from theseus.config import registry
    from theseus.config.errors import suggest

    for word in _arguments(argv):
        if "=" in word or word.startswith("~"):
            continue
        registry.load()
        choices = {name: f"+{group}={name}" for group in registry.FOLDERS for name in registry.folder_options(group)}
        choices.update({name: f"{group}={name}" for group in registry.groups() for name in registry.names(group)})
        close = suggest(word, choices, n=1)
        hint = f"did you mean {choices[close[0]]}?" if close else "every argument is KEY=VALUE (see --help)"
        raise ConfigError(f"unexpected argument {word!r}: {hint}")


# Hydra's modes, one per command: each with its spellings
MODES = {"--run": {"--run", "-r"}, "--multirun": {"--multirun", "-m"}, "--cfg": {"--cfg", "-c"},
         "--info": {"--info", "-i"}, "--shell-completion": {"--shell-completion", "-sc"}}


def check_modes(argv: Sequence[str]) -> None:
    """Hydra does one of run, multirun, --cfg, --info and completion per command: two given is a
    ConfigError naming them (Hydra's own is a traceback after composing)."""
    given = [next(flag for flag in argv if flag in spellings) for spellings in MODES.values() if spellings & set(argv)]
    if len(given) > 1:
        hint = " (drop -m to print one job's config)" if "--cfg" in given or "-c" in given else ""
        raise ConfigError(f"{' and '.join(given)} cannot be given together: Hydra does one of them per "
                          f"command{hint}")


def is_multirun(argv: Sequence[str]) -> bool:
    return bool({"-m", "--multirun"} & set(argv))


def job_overrides(argv: Sequence[str], sweep_params: Sequence[str] = ()) -> list[list[str]]:
    """The overrides of each job that ``argv`` asks for: several with ``-m``, where the sweep
    file's ``hydra.sweeper.params`` (``sweep_params``, as ``KEY=VALUES``) come first, as Hydra's
    basic sweeper puts them."""
    overrides = overrides_of(argv)
    if not is_multirun(argv):
        return [overrides]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides([*sweep_params, *overrides])
    except Exception:  # a sweeper's own syntax Hydra cannot parse: check the plain keys
        return [[o for o in overrides if "(" not in o]]
    parsed = parser.parse_overrides([_enumerable(o) for o in parsed])
    return [job for batch in _split_sweep(parsed) for job in batch]


def _enumerable(override) -> str:
    """``override`` as a line Hydra's basic sweeper expands: a continuous search space
    (Optuna's ``interval(1e-4, 1e-2)``, tagged ``log`` or ``int``) stands for one of its
    values, its lower bound, so that the key and the type of what the sweeper will choose
    are checked before any trial runs; the sweeper itself still gets the line as written."""
    from hydra.core.override_parser.types import ValueType

    if override.value_type is not ValueType.INTERVAL_SWEEP:
        return override.input_line
    interval = override.value()
    start = int(interval.start) if "int" in interval.tags else interval.start
    return f"{override.get_key_element()}={start}"


def _split_sweep(parsed: list) -> list[list[list[str]]]:
    """Hydra's own expansion of parsed sweep overrides into jobs (its one private API used here;
    tests/e2e/test_run.py fails loudly should it change)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper.split_arguments(parsed, None)


def sweep_params(cfg: DictConfig) -> list[str]:
    """A composed config's ``hydra.sweeper.params`` as ``KEY=VALUES`` overrides."""
    params = cfg.hydra.sweeper.get("params") or {}
    return [f"{key}={value}" for key, value in params.items()]


def preflight(argv: list[str]) -> tuple[DictConfig, list] | None:
    """Compose and check every job ``argv`` describes; ConfigError on the first mistake.

    Returns the first job's composed config (its ``hydra`` node kept) and the jobs' assembled
    runs (a single run's compiled, its run directory checked; a sweep's checked only, each job
    assembled again where it runs; none for a task of its own or a remote launcher's job), or
    None when there is nothing left for Hydra to do (a dry run has been done).
    """
    check_modes(argv)
    check_words(argv)
    base = compose(job_overrides(argv)[0], hydra=True)  # the first job of the command line: its sweep file
    if INFO_FLAGS & set(argv):
        return base, []
    from theseus.recipe import assemble, resolve  # the trainer's imports: after a typo's error, not before
    from theseus.tasks.task import JobTask, task_class
    from theseus.training.settings import configure_settings

    if not is_multirun(argv):
        base = continue_last(base)  # resume=last: the run this command started; auto: names an unfinished one
    initialize(_job(base)[0])  # join the job (several hosts) before anything touches a device
    gpus = visible_gpus()
    if is_multirun(argv) and gpus:  # parallel jobs on this host: one GPU share each, or refused now
        check_enough(parallel_jobs(base.hydra.launcher), gpus)
    check_hydra(base.hydra, is_multirun(argv))  # the launcher's settings, before anything is submitted
    remote = submits(base.hydra.launcher)  # jobs assembled where they run (other machines, other processes)
    runs, planned = [], []
    for overrides in job_overrides(argv, sweep_params(base) if is_multirun(argv) else ()):
        cfg, run_dir = _job(compose(overrides, hydra=True) if is_multirun(argv) else base)
        if remote:
            check_here(cfg)
        if remote or issubclass(task_class(cfg), JobTask):  # assembled where it runs, or a job of its own
            continue
        if configure_settings(cfg).trainer.dry_run:
            planned.append((overrides, cfg))
        elif is_multirun(argv):
            runs.append(assemble(resolve(cfg), steps=None))
        else:
            runs.append(assemble(resolve(cfg, run_dir)))
    if planned and not runs:
        plan(planned)
        return None
    return base, runs


def check_here(cfg: DictConfig) -> None:
    """A job that runs elsewhere (a submitit launcher's), checked here as far as it can be without
    its devices and data: each group's settings, the task, and the model's own checks (where
    ``trainer.init_from`` does not bring the architecture from a folder the job reads there)."""
    from theseus.tasks.task import LossTask
    from theseus.training.settings import check_model
    from theseus.training.spec import configure_parts

    settings, task, _, _ = configure_parts(cfg)
    if isinstance(task, LossTask) and settings.trainer.init_from is None:
        check_model(cfg)


def plan(planned: list[tuple[list[str], DictConfig]]) -> None:
    """Dry-run each planned job (``trainer.dry_run``); a sweep over targets ends with a table of
    its points, and ``trainer.plan_file`` gets them as JSON lines. A sweep's points are all
    assembled (checked, not compiled) before the first compiles: a mistake in its last point
    is one line, before any work."""
    from theseus.cli.sweep import print_plans, write_plan
    from theseus.plan.dry_run import dry_run
    from theseus.recipe import assemble, resolve
    from theseus.training.settings import configure_settings

    def build(cfg: DictConfig, **kwargs):  # a changed config (a candidate setting) is resolved anew
        return assemble(resolve(cfg), **kwargs)

    if len(planned) > 1:
        for _, cfg in planned:
            build(cfg, steps=None)
    labels = [overrides for overrides, _ in planned]
    plans = [dry_run(cfg, build, in_sweep=len(planned) > 1) for _, cfg in planned]
    if len(plans) > 1 and any(point["target"] for point in plans):
        print_plans(labels, plans)
    plan_file = configure_settings(planned[0][1]).trainer.plan_file
    if plan_file:
        write_plan(plan_file, labels, plans)
        print(f"plan: {plan_file} ({sum(point['fits'] is True for point in plans)} of {len(plans)} points fit)")


def _job(composed: DictConfig) -> tuple[DictConfig, Path]:
    """A composed config (with its ``hydra`` node) as the job's config and run directory;
    the directory is fixed in ``composed`` (its ``${now:...}`` resolved once)."""
    run_dir = Path(composed.hydra.run.dir)
    with read_write(composed.hydra):
        composed.hydra.run.dir = str(run_dir)
    cfg = composed.copy()
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, run_dir


class JobFailed(CompactHydraException):
    """A sweep job's ConfigError or TrainingError, as ``TrainingError: message``: Hydra records
    the job as failed, runs the others, then prints this line instead of a traceback."""


def execute(cfg: DictConfig, run_dir: Path, run=None) -> float:
    """Run one job in ``run_dir``; returns the objective (the final val loss).

    A JobTask (``task=regression``) runs the job itself; the trainer trains any other task
    (``run``: the job already assembled for ``run_dir``).
    """
    from theseus.recipe import assemble, resolve
    from theseus.tasks.task import JobTask, task_class
    from theseus.training.trainer import Trainer

    if issubclass(task_class(cfg), JobTask):
        return configured(task_class(cfg), cfg).run(cfg, run_dir)
    return Trainer(run or assemble(resolve(cfg, run_dir))).run(run_dir)


def hydra_task(run=None):
    """Hydra's task function: runs the job in its output directory, reporting a ConfigError or
    TrainingError in one line; jobs run in parallel (joblib) prefix their lines with ``[job N]``.
    ``run``: the preflight's, reused by a single run."""

    def task(cfg: DictConfig) -> float:
        from theseus.cli.sweep import one_line, quiet_jobs

        hydra_config = HydraConfig.get()
        parallel = hydra_config.mode == RunMode.MULTIRUN and parallel_jobs(hydra_config.launcher) > 1
        if quiet_jobs(hydra_config):  # a sweep off a terminal: its run.log gets the run, the console a line
            shown = one_line(hydra_config)
        else:
            shown = prefixed_output(f"[job {hydra_config.job.num}] ") if parallel else contextlib.nullcontext()
        with shown:
            return job(cfg, hydra_config)

    def job(cfg: DictConfig, hydra_config) -> float:
        from theseus.training.trainer import TrainingError

        try:
            claim_devices(hydra_config)  # parallel jobs on one host: each its own GPUs, before JAX starts
            load()  # a fresh worker process (joblib, submitit) registers the user's modules here
            if not is_checked(cfg):  # a sweeper's composition (the preflight checked its own)
                validate(cfg)
            initialize(cfg)  # a no-op when main() has joined already; launchers such as submitit call here first
            return execute(cfg, Path(hydra_config.runtime.output_dir), run)
        except (ConfigError, TrainingError) as exc:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            if hydra_config.mode == RunMode.MULTIRUN:
                raise JobFailed(f"{type(exc).__name__}: {exc}") from exc
            print(f"theseus: error: {exc}", file=sys.stderr)
            sys.exit(1)

    return task


class Callbacks:
    """The ``hydra.callbacks`` of a composed config, each built with ``hydra.utils.instantiate``,
    called as Hydra calls them: in order at a start, in reverse at an end; one that raises is a
    warning. What ``run_job`` (and ``run_composed``) call."""

    def __init__(self, composed: DictConfig):
        from hydra.utils import instantiate

        declared = composed.hydra.get("callbacks") or {}
        self.callbacks = [instantiate(params) for params in declared.values()]

    def _notify(self, hook: str, reverse: bool = False, **kwargs) -> None:
        for callback in reversed(self.callbacks) if reverse else self.callbacks:
            try:
                getattr(callback, hook)(**kwargs)
            except Exception as exc:
                warnings.warn(f"Callback {type(callback).__name__}.{hook} raised {type(exc).__name__}: {exc}",
                              stacklevel=3)

    def on_run_start(self, **kwargs) -> None:
        self._notify("on_run_start", **kwargs)

    def on_job_start(self, **kwargs) -> None:
        self._notify("on_job_start", **kwargs)

    def on_job_end(self, **kwargs) -> None:
        self._notify("on_job_end", reverse=True, **kwargs)

    def on_run_end(self, **kwargs) -> None:
        self._notify("on_run_end", reverse=True, **kwargs)


def run_composed(composed: DictConfig, task) -> None:
    """Run ``task`` on the single job ``composed`` (a composition with its ``hydra`` node) as
    ``hydra.main`` runs one: its output directory, ``.hydra/`` files, logging and callbacks,
    without composing it again (``hydra.core.utils.run_job``, Hydra's public job runner)."""
    from hydra.core.utils import run_job
    from hydra.types import HydraContext

    with read_write(composed.hydra):
        composed.hydra.mode = RunMode.RUN
    callbacks = Callbacks(composed)
    callbacks.on_run_start(config=composed, config_name="config")
    ret = run_job(task_function=task, config=composed, job_dir_key="hydra.run.dir", job_subdir_key=None,
                  hydra_context=HydraContext(config_loader=None, callbacks=callbacks))
    callbacks.on_run_end(config=composed, config_name="config", job_return=ret)
    _ = ret.return_value  # re-raises the job's exception


def train(config: Sequence[str] | DictConfig, run_dir: str | Path) -> float:
    """Train one job from Python, with the command line's checks; returns the final val loss.

    ``config``: overrides as on the command line (``["+experiment=gpt_tiny", "optimizer.lr=1e-3"]``)
    or a config from ``theseus.compose``. ``run_dir`` receives what a command-line run writes
    (``.hydra/config.yaml`` included, so ``theseus.sample`` reads it); a run there is resumed.
    The commands it prints at its end are ``python -m theseus.run`` commands of this config.
    """
    from theseus.config.overrides import overrides_for
    from theseus.recipe import assemble, resolve
    from theseus.sources.in_config import command_line_choice
    from theseus.tasks.task import JobTask, task_class
    from theseus.training.commands import started_by

    cfg = config if isinstance(config, DictConfig) else compose([*config, *command_line_choice(config)])
    run_dir = Path(run_dir)
    run = None if issubclass(task_class(cfg), JobTask) else assemble(resolve(cfg, run_dir))
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    with started_by([*overrides_for(cfg), f"hydra.run.dir={run_dir}"]):  # the command its printed lines give
        return execute(cfg, run_dir, run)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    completion = {"-sc", "--shell-completion"} & set(argv)
    try:
        if {"--help", "-h"} & set(argv):
            print(usage(), end="")
            return
        if completion:  # completion asks Hydra alone, and must not fail on a half-typed line
            load()
            from theseus.config import registry

            for group in registry.groups():
                registry.options(group)  # imported: completion offers every option's keys
            registry.store()
            checked = None, []
        else:
            from theseus.base.compilation_cache import use_compilation_cache

            use_compilation_cache()
            from theseus.sources.in_config import command_line_choice

            # trainer.init_from=HF_DIR without model=: the model the folder loads into (Mixtral: moe)
            argv = beside_overrides(argv, command_line_choice(overrides_of(argv)))
            with BeforeStart():  # a signal while compiling: one line, the signal's exit code
                checked = preflight(argv)
            if checked is not None and {"--cfg", "-c"} & set(argv):  # what will run, derived values included
                argv = beside_overrides(argv, derived_overrides(checked[0]))
    except ConfigError as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"theseus: error: {exc}", file=sys.stderr)
        sys.exit(2)
    if checked is None:  # a dry run, done
        return
    base, runs = checked
    if base is not None and not any(arg.startswith("-") for arg in argv):  # one job, no Hydra flag
        run_composed(base, hydra_task(runs[0] if runs else None))
        return
    sys.argv = [sys.argv[0], *argv]  # what Hydra parses
    hydra.main(config_path=str(conf_dir()), config_name="config", version_base=None)(hydra_task())()
