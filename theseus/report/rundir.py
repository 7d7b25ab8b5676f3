"""A run directory as written by a Hydra job, and a sweep folder as a list of them.

A run directory holds ``.hydra/`` (config.yaml, overrides.yaml) and ``metrics.jsonl``; a sweep
folder holds one run directory per job (``0/``, ``1/``, ...).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

METRICS = "metrics.jsonl"


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
        """The command-line overrides as key -> value (``+`` dropped, numbers parsed)."""
        return dict(parse_override(o) for o in self.overrides)

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


def parse_override(override: str) -> tuple[str, Any]:
    """``+optimizer.lr=1e-3`` -> ``("optimizer.lr", 0.001)``; non-numbers stay strings."""
    key, _, text = override.lstrip("+").partition("=")
    for kind in (int, float):
        try:
            return key, kind(text)
        except ValueError:
            pass
    return key, text


def is_run(path: Path) -> bool:
    return (path / ".hydra" / "config.yaml").is_file()


def job_dirs(path: Path) -> list[Path]:
    """The run directories directly under a sweep folder, in job order (empty: not a sweep)."""
    jobs = [child for child in path.iterdir() if is_run(child)] if path.is_dir() else []
    return sorted(jobs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))
