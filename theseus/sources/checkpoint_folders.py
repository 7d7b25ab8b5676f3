"""theseus's own checkpoints as folders on disk, found by listing them (no JAX work: they are
found before a run sets its devices).

    run/.hydra/config.yaml          the run's config (SAVED_CONFIG)
    run/checkpoints/STEP/           one step: state/ (Orbax's arrays), data/, config/, base/ (BASE_RECORD)

A user points at a run directory, its ``checkpoints/`` or one step's folder.
"""

from __future__ import annotations

import json
from pathlib import Path

SAVED_CONFIG = Path(".hydra") / "config.yaml"
BASE_RECORD = Path("base") / "metadata"  # the file Orbax's JSON handler writes a LoRA run's ``base`` item to


def steps_in(folder: Path) -> list[int]:
    """The step folders in ``folder`` (an existing folder), by their numbers."""
    return [int(child.name) for child in folder.iterdir() if child.name.isdigit() and child.is_dir()]


def theseus_checkpoint(path: Path) -> Path | None:
    """``path`` when it holds theseus checkpoints: a run directory with ``checkpoints/``, that
    folder, or one step's folder in it; None otherwise."""
    path = Path(path).expanduser()
    if (path / "checkpoints").is_dir() and steps_in(path / "checkpoints") or path.is_dir() and steps_in(path):
        return path
    if path.name.isdigit() and (path / "state").is_dir():
        return path
    return None


def run_of(checkpoint: Path) -> Path | None:
    """The run directory of a theseus checkpoint path (the folder holding ``.hydra/``)."""
    for folder in (checkpoint, *checkpoint.parents[:2]):
        if (folder / SAVED_CONFIG).is_file():
            return folder
    return None


def step_dir(path: Path) -> Path | None:
    """The step folder a checkpoint path points at (as ``CheckpointReader.at``: a step's folder,
    else the newest step of a run directory or its checkpoints/); None when there is none."""
    path = Path(path).expanduser()
    if path.name.isdigit() and path.is_dir():
        return path
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    steps = [int(child.name) for child in folder.iterdir() if child.name.isdigit()] if folder.is_dir() else []
    return folder / str(max(steps)) if steps else None


def base_record(step: Path) -> dict | None:
    """The record of the frozen base the checkpoint in the step folder ``step`` was saved without
    (a LoRA run's: its folder and fingerprint); None: it holds every parameter."""
    file = step / BASE_RECORD
    return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None


def saved_base(path: Path) -> dict | None:
    """The base record of the checkpoint ``path`` points at (``step_dir``); None when it holds
    every parameter, or there is none."""
    found = step_dir(path)
    return base_record(found) if found else None
