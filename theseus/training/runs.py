"""Runs as data: a run directory as a Hydra job leaves it, and a sweep folder as its jobs.

A run directory holds ``.hydra/`` (config.yaml, overrides.yaml), ``metrics.jsonl`` and, in a
sweep, ``result.json`` (the job's status); a sweep folder holds one run directory per job
(``0/``, ``1/``, ...). The sweep summary (``theseus.sweep``) and the report
(``theseus.report``) both read runs through this module, and import nothing heavier: the
summary is rewritten inside every job.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

METRICS = "metrics.jsonl"
RESULT = "result.json"
SUMMARY_METRICS = ("val_loss", "tokens_per_s", "mfu")  # a job's final values in the sweep summary
FORMATS = {"loss": "{:.4f}", "val_loss": "{:.4f}", "tokens_per_s": "{:,.0f}", "mfu": "{:.2%}"}


@dataclasses.dataclass(frozen=True)
class Run:
    """What a run directory recorded: its overrides, config and logged metrics."""

    path: Path
    overrides: tuple[str, ...]
    config: dict[str, Any]
    metrics: tuple[dict[str, Any], ...]

    @classmethod
    def load(cls, path: Path) -> Run:
        hydra = path / ".hydra"
        overrides = OmegaConf.load(hydra / "overrides.yaml") if (hydra / "overrides.yaml").is_file() else []
        config = OmegaConf.to_container(OmegaConf.load(hydra / "config.yaml"))
        return cls(path, tuple(overrides), config, tuple(read_metrics(path / METRICS)))

    @property
    def params(self) -> dict[str, Any]:
        """The command-line overrides as key -> value, typed as Hydra types them (``+`` dropped;
        ``true``, ``null``, numbers and lists parsed; a deletion ``~key`` has no value: left out)."""
        return dict(parsed for o in self.overrides if (parsed := parse_override(o)) is not None)

    @property
    def tokens_per_step(self) -> int | None:
        """trainer.batch_size x architecture.seq_len, where the config has both."""
        batch = self.config.get("trainer", {}).get("batch_size")
        seq = self.config.get("architecture", {}).get("seq_len")
        return batch * seq if isinstance(batch, int) and isinstance(seq, int) else None

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """The steps at which ``key`` was logged, and its values."""
        rows = [row for row in self.metrics if row.get(key) is not None and "step" in row]
        return [row["step"] for row in rows], [row[key] for row in rows]

    def last(self, key: str) -> float | None:
        """The last logged value of ``key`` (None if never logged)."""
        return next((row[key] for row in reversed(self.metrics) if row.get(key) is not None), None)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path``; a line cut short (a job killed mid-write) is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


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


def is_run(path: Path) -> bool:
    return (path / ".hydra" / "config.yaml").is_file()


def job_dirs(path: Path) -> list[Path]:
    """The run directories directly under a sweep folder, in job order (empty: not a sweep)."""
    jobs = [child for child in path.iterdir() if is_run(child)] if path.is_dir() else []
    return sorted(jobs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))


@dataclasses.dataclass(frozen=True)
class Job:
    """One job of a sweep as its run directory recorded it."""

    name: str  # its folder in the sweep folder
    params: dict[str, Any]  # its command-line overrides
    status: str  # ok, failed, or unfinished (no result: still running, or killed)
    error: str
    val_loss: float | None
    tokens_per_s: float | None
    mfu: float | None

    @classmethod
    def load(cls, path: Path) -> Job:
        run = Run.load(path)
        result = json.loads((path / RESULT).read_text()) if (path / RESULT).is_file() else {}
        return cls(path.name, run.params, result.get("status", "unfinished"), result.get("error", ""),
                   *(run.last(key) for key in SUMMARY_METRICS))


def collect(sweep_dir: Path) -> list[Job]:
    """Every job of the sweep folder, in job order."""
    return [Job.load(path) for path in job_dirs(sweep_dir)]


def swept(jobs: Sequence[Job]) -> list[str]:
    """The override keys whose value differs between jobs (all of them for a single job)."""
    keys = list(dict.fromkeys(key for job in jobs for key in job.params))
    if len(jobs) < 2:
        return keys
    return [key for key in keys if len({repr(job.params.get(key)) for job in jobs}) > 1]


def rows(jobs: Sequence[Job]) -> list[dict[str, Any]]:
    """One flat row per job: job, the swept values, the metrics, status, error."""
    keys = swept(jobs)
    return [{"job": job.name, **{key: job.params.get(key) for key in keys},
             **{key: getattr(job, key) for key in SUMMARY_METRICS}, "status": job.status, "error": job.error}
            for job in jobs]


def fmt(column: str, value: Any) -> str:
    """A summary cell as text: losses to 4 decimals, tokens/s whole, MFU in percent."""
    if value is None:
        return ""
    if column in FORMATS:
        return FORMATS[column].format(value)
    return f"{value:.6g}" if isinstance(value, float) else str(value)
