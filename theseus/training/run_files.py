"""The files a job keeps in its run directory beside ``metrics.jsonl``, as the job writes them.

``result.json`` (how the job ended: a failure's one line), ``samples.jsonl`` (an evaluation's
examples), ``wandb/run_id`` (the W&B run a resume continues) and ``checkpoints/STEP``. The logger
and the sweep summary write them; the report (``theseus.report.records``) reads them back.
``parse_override`` types a command-line override as Hydra does (a run's hyperparameters).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import CompactHydraException, HydraException

SAMPLES = "samples.jsonl"  # an evaluation's examples, one JSON line each with its step (theseus.training.logger)
RESULT = "result.json"
WANDB_ID = Path("wandb", "run_id")  # under a run directory: its W&B run id (kept so that a resume continues it)


def error_line(exc: BaseException) -> str:
    """``ValueError: first line of the message``; a Hydra compact error's message is that line."""
    message = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    if isinstance(exc, CompactHydraException):
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def parse_override(override: str) -> tuple[str, Any] | None:
    """``+optimizer.lr=1e-3`` -> ``("optimizer.lr", 0.001)``, ``trainer.dry_run=true`` ->
    ``("trainer.dry_run", True)``: Hydra's own override parser. None for a deletion (``~key``);
    text Hydra cannot parse stays a string."""
    try:
        parsed = _PARSER.parse_override(override)
    except HydraException:
        key, _, text = override.lstrip("+").partition("=")
        return key, text
    return None if parsed.is_delete() else (parsed.key_or_group, parsed.value())


_PARSER = OverridesParser.create()


def record_failure(run_dir: Path, exc: BaseException) -> None:
    """Write ``result.json`` saying the run failed with ``exc`` (a run without one has not failed)."""
    (run_dir / RESULT).write_text(json.dumps({"status": "failed", "error": error_line(exc)}) + "\n")


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the checkpoints ``run_dir`` holds (``checkpoints/STEP``; a save in progress
    has another name until it is complete)."""
    checkpoints = run_dir / "checkpoints"
    return [int(path.name) for path in checkpoints.iterdir() if path.name.isdigit()] if checkpoints.is_dir() else []


def resumable(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint to resume from (``checkpoints/STEP``)."""
    return bool(checkpoint_steps(run_dir))
