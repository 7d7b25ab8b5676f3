"""Resume safety: a run directory continues only under the config it was trained with.

Changes that would alter shapes, the data order or the optimizer are refused with the diff;
changes that only affect logging, evaluations and their cadence, checkpoint cadence or the
device layout (restoring onto another mesh is supported) pass. ``trainer.max_steps`` may
change where the learning rates of the steps already taken stay the same (the trainer judges).

``trainer.resume=last`` finds the run a command continues without a copied path: of the runs
that the same command started (its recorded overrides; in a default folder under ``outputs/``,
not one given ``hydra.run.dir``) whose saved config it may continue, the furthest that is
unfinished (a repeat of the command, stopped early, does not hide the long run before it), else
the newest; the others left unfinished are named, each with the command that continues it.

``trainer.init_data`` reads on where another run stopped in its data: only in the same data
(``check_asked``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write

from theseus.config import ConfigError, registry
from theseus.config.schema import flatten
from theseus.config.yaml_file import load_yaml
from theseus.sources.checkpoint_folders import SAVED_CONFIG, theseus_checkpoint
from theseus.sources.model_source import ModelSource
from theseus.training.checkpoint import Checkpointer
from theseus.training.config import TrainerConfig
from theseus.training.metrics import format_apart
from theseus.training.optimizer import make_schedule
from theseus.training.settings import Settings

MAX_STEPS = "trainer.max_steps"


def check_asked(trainer: TrainerConfig, source: ModelSource | None, cfg: DictConfig) -> None:
    """ConfigError when ``trainer.init_optimizer`` or ``init_data`` asks ``source`` for what it
    lacks (a Hugging Face folder or GGUF file holds weights alone); and a data position is one in
    the run's own data: ``init_data`` with ``data.*`` changed (those a resume may not change) is
    refused, ``cfg`` being this run's config."""
    if source is not None:
        source.check_asked(trainer.init_optimizer, trainer.init_data)
    if trainer.init_data and source is not None and source.run_dir is not None:
        saved = OmegaConf.to_container(registry.read_saved(source.run_dir / SAVED_CONFIG), resolve=True)
        changes = [change for change in unsafe_changes(saved, OmegaConf.to_container(cfg, resolve=True))
                   if change[0].startswith("data.")]
        if changes:
            diff = ", ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changes)
            raise ConfigError(f"trainer.init_data=true reads on where {source} stopped in its data, but this run's "
                              f"data differs ({diff}): a position in other data means nothing; give the run's "
                              f"data.* or drop trainer.init_data")


def resumable_keys(*configs: Mapping[str, Any]) -> frozenset[str]:
    """The keys declared ``resumable`` (by their field or its class) by the options ``configs``
    chose (none given: by any registered option)."""
    registry.load()
    schemas = [registry.chosen_schema(cfg) for cfg in configs] or [registry.every_key()]
    return frozenset(key for schema in schemas for key, spec in schema.items() if spec.resumable)


def unsafe_changes(saved: Mapping[str, Any], new: Mapping[str, Any],
                   also: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, new value)`` for every change a resume cannot honour: any but of a
    resumable key (or of an entry of one: ``mesh.rules.embed``) or of a key in ``also``. A key
    the saved config lacks (declared since it was saved) at its default is no change."""
    old, cur = ({**flatten(cfg), **flatten({registry.RECORD: registry.choices_of(cfg)})} for cfg in (saved, new))
    safe = resumable_keys(saved, new) | set(also)
    schema = registry.chosen_schema(new)

    def may_change(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[:n]) in safe for n in range(1, len(parts) + 1))

    def added(key: str) -> bool:
        return key not in old and key in schema and cur[key] == schema[key].default

    keys = sorted(set(old) | set(cur))
    return [(k, old.get(k), cur.get(k)) for k in keys
            if old.get(k) != cur.get(k) and not may_change(k) and not added(k)]


def check_resume(run_dir: Any, saved: Mapping[str, Any], new: Mapping[str, Any],
                 max_steps_problem: str | None = None) -> None:
    """ConfigError listing the unsafe changes between the saved config and the new one.

    ``max_steps_problem``: why ``trainer.max_steps`` may not change (None: it may).
    """
    changes = unsafe_changes(saved, new, (MAX_STEPS,))
    if not changes and max_steps_problem and flatten(saved).get(MAX_STEPS) != flatten(new).get(MAX_STEPS):
        raise ConfigError(f"cannot continue {run_dir} to {MAX_STEPS}={flatten(new).get(MAX_STEPS)}: "
                          f"{max_steps_problem}")
    if changes:
        diff = ", ".join(f"{key}: {old!r} -> {cur!r}" for key, old, cur in changes)
        raise ConfigError(f"cannot resume {run_dir} with a changed config ({diff}): these alter shapes, data "
                          f"order or the optimizer; revert them, or use a new hydra.run.dir")


def runs_root(composed: DictConfig) -> Path | None:
    """The folder above every default run directory: ``outputs`` for Hydra's
    ``outputs/${now:...}/${now:...}`` (None when ``hydra.run.dir`` is a fixed folder)."""
    template = OmegaConf.to_container(composed.hydra.run, resolve=False)["dir"]
    parts = Path(template).parts
    fixed = parts[:next((i for i, part in enumerate(parts) if "${" in part), len(parts))]
    return Path(*fixed) if len(fixed) < len(parts) and fixed else None


def same_command(overrides: Sequence[str], others: Sequence[str]) -> bool:
    """Whether two runs' command-line overrides are the same command: up to their order,
    ``trainer.resume`` and ``trainer.max_steps`` (a longer run continues where its schedule allows)."""
    def words(given: Sequence[str]) -> list[str]:
        return sorted(str(o) for o in given if not str(o).lstrip("+").startswith(("trainer.resume=", f"{MAX_STEPS}=")))

    return words(overrides) == words(others)


def started_runs(composed: DictConfig) -> list[Path]:
    """The run directories that this command (``composed``: a single run's, with its ``hydra``
    node) started before: in Hydra's default folders under ``runs_root`` (none given
    ``hydra.run.dir``), with the same overrides (``same_command``)."""
    root = runs_root(composed)
    if root is None or not root.is_dir():
        return []
    template = Path(OmegaConf.to_container(composed.hydra.run, resolve=False)["dir"])
    depth = len(template.parts) - len(root.parts)
    found = []
    for recorded in root.glob("/".join(["*"] * depth) + "/.hydra/overrides.yaml"):
        hydra = recorded.parent
        try:
            if not same_command(load_yaml(recorded, ListConfig), composed.hydra.overrides.task):
                continue
            given = load_yaml(hydra / "hydra.yaml").hydra.overrides.hydra  # Hydra's record of its own overrides
        except (ConfigError, OSError, AttributeError):  # not a run this command wrote
            continue
        if not any(str(o).lstrip("+").startswith("hydra.run.dir=") for o in given):
            found.append(hydra.parent)
    return found


def newest_step(run_dir: Path) -> int:
    """The step of ``run_dir``'s newest checkpoint (0: none)."""
    return max((int(p.name) for p in (run_dir / "checkpoints").glob("*") if p.name.isdigit()), default=0)


def continuable(runs: Sequence[Path], config: Mapping[str, Any]) -> list[Path]:
    """The ``runs`` with checkpoints whose saved config ``config`` may continue (``trainer.max_steps``
    aside: extending is judged on resuming), newest (by their latest checkpoint) first."""
    candidates = []
    for run_dir in runs:
        if not newest_step(run_dir):
            continue
        try:
            saved = OmegaConf.to_container(registry.read_saved(run_dir / ".hydra" / "config.yaml"), resolve=True)
        except ConfigError:  # a damaged run: not one to continue
            continue
        if unsafe_changes(saved, config, (MAX_STEPS,)):
            continue
        candidates.append((max(p.stat().st_mtime for p in (run_dir / "checkpoints").iterdir()), run_dir))
    return [run_dir for _, run_dir in sorted(candidates, reverse=True)]


def last_run(runs: Sequence[Path], config: Mapping[str, Any]) -> tuple[Path | None, list[Path]]:
    """``(the run trainer.resume=last continues, the others left unfinished)`` among ``runs``
    (``continuable`` under ``config``): the furthest of those short of ``config``'s
    trainer.max_steps, the newest of them on a tie; with none unfinished, the newest (complete:
    nothing to train); ``(None, [])`` when none may be continued."""
    found = continuable(runs, config)
    unfinished = [run_dir for run_dir in found if newest_step(run_dir) < config["trainer"]["max_steps"]]
    if not unfinished:
        return (found[0] if found else None), []
    furthest = max(unfinished, key=newest_step)  # max keeps the first, the newest, of equals
    return furthest, [run_dir for run_dir in unfinished if run_dir != furthest]


def continue_last(composed: DictConfig) -> DictConfig:
    """``composed`` (a single run's, with its ``hydra`` node) with ``hydra.run.dir`` the run that
    ``trainer.resume=last`` continues (``last_run`` of those this command started:
    ``started_runs``), said in one line with its step and the other unfinished runs, each with
    the command that continues it; a new run when there is none (said too). With
    ``trainer.resume=auto`` in a new default folder, the run of this command that ``resume=last``
    would continue, left unfinished, is named in one line with the command that continues it.
    Unchanged otherwise."""
    from theseus.training.commands import command_line, resume_command

    resume = composed.trainer.resume
    if resume not in ("auto", "last") or runs_root(composed) is None:  # a fixed hydra.run.dir: that one
        return composed
    job = composed.copy()
    with open_dict(job):
        del job["hydra"]
    found, others = last_run(started_runs(composed), OmegaConf.to_container(job, resolve=True))
    planned = composed.trainer.max_steps
    if resume == "auto":
        if not composed.trainer.dry_run and found and newest_step(found) < planned:
            print(f"theseus: a new run; {found}, which this command started, stopped at step {newest_step(found)} "
                  f"of {planned}: to continue it instead, run {resume_command(found)}", file=sys.stderr)
        return composed
    if found is None:
        print(f"theseus: trainer.resume=last: no run under {runs_root(composed)}/ that this command started; "
              f"starting a new one", file=sys.stderr)
        return composed
    also = ""
    if others:
        stopped = ", ".join(f"{run_dir} at step {newest_step(run_dir)}" for run_dir in others)
        one = others[0] if len(others) == 1 else "DIR"
        also = (f", the furthest of the runs this command left unfinished (also {stopped}: to continue "
                f"{'that one' if len(others) == 1 else 'one of those, DIR'} instead, run "
                f"{command_line(add=[f'hydra.run.dir={one}'])})")
    print(f"theseus: trainer.resume=last: resuming {found} at step {newest_step(found)} of {planned}{also}",
          file=sys.stderr)
    composed = composed.copy()
    with read_write(composed.hydra):
        composed.hydra.run.dir = str(found)
    return composed


def extension_problem(run_dir: Path, saved_steps: int, optimizer: Any, max_steps: int) -> str | None:
    """Why ``run_dir`` (trained for ``saved_steps``) cannot go on to ``max_steps``: the steps it
    has taken would have had other learning rates (a cosine decays over all the steps); None
    when they keep theirs (a constant schedule, or wsd's stable phase)."""
    taken = newest_step(run_dir)
    steps = np.arange(taken)
    before = np.asarray(make_schedule(optimizer, saved_steps)(steps))
    after = np.asarray(make_schedule(optimizer, max_steps)(steps))
    changed = np.flatnonzero(~np.isclose(before, after, rtol=1e-6, atol=0))
    if not changed.size:
        return None
    first = int(changed[0])
    if optimizer.schedule == "cosine":
        extends = "a constant or wsd schedule can be extended in place"
    else:  # the warmup was cut to the steps the run had, or a wsd's decay has begun
        extends = (f"a {optimizer.schedule} schedule extends in place only once its warmup "
                   f"(optimizer.warmup_steps={optimizer.warmup_steps}) is over"
                   + (" and before its decay" if optimizer.schedule == "wsd" else ""))
    would, was = format_apart(float(after[first]), float(before[first]))
    return (f"with optimizer.schedule={optimizer.schedule} the learning rate of step {first + 1} (of the "
            f"{taken} taken) would have been {would}, not {was}. Start a new run from "
            f"its weights instead: trainer.init_from={run_dir} trainer.max_steps={max_steps} "
            f"hydra.run.dir=NEW (trainer.init_optimizer=true keeps its optimizer state); {extends}")


def check_run_dir(run_dir: Path, composed: DictConfig, settings: Settings) -> None:
    """Refuse what the run cannot do with ``run_dir`` (before anything is written or compiled).

    ``trainer.resume``: ``never`` refuses a directory with checkpoints; ``auto`` (and ``last``,
    which has chosen ``run_dir``) refuses to continue one whose saved config differs in shapes,
    data order or optimizer, or whose ``trainer.max_steps`` changes the learning rates of steps
    already taken; a path must hold checkpoints.
    """
    resume, used = settings.trainer.resume, Checkpointer.exists(run_dir / "checkpoints")
    if resume == "never" and used:
        raise ConfigError(f"{run_dir} already has checkpoints and trainer.resume=never: "
                          f"choose a new hydra.run.dir, or trainer.resume=auto to continue it")
    if resume not in ("auto", "last", "never") and theseus_checkpoint(Path(resume)) is None:
        raise ConfigError(f"trainer.resume={resume} is not a checkpoint: give a run directory with "
                          f"checkpoints/, its checkpoints/ folder or one step's folder (or auto, last, never)")
    saved = run_dir / ".hydra" / "config.yaml"
    if resume in ("auto", "last") and used and saved.is_file():
        old = OmegaConf.to_container(registry.read_saved(saved), resolve=True)
        problem = extension_problem(run_dir, old["trainer"]["max_steps"], settings.optimizer,
                                    settings.trainer.max_steps)
        check_resume(run_dir, old, OmegaConf.to_container(composed, resolve=True), problem)
