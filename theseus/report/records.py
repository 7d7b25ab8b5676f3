"""Runs as data: a run directory as a Hydra job leaves it, and a sweep folder as its jobs.

A run directory holds ``.hydra/`` (config.yaml, overrides.yaml), ``metrics.jsonl`` and, in a
sweep, ``result.json`` (the job's status); a sweep folder holds one run directory per job
(``0/``, ``1/``, ...); the names of the files a job writes are ``theseus.training.run_files``'.
The sweep summary (``theseus.cli.sweep``) and the report (``theseus.report``) both read runs
through this module, and import nothing heavier: the summary is rewritten inside every job. A
run directory read is a ``RunRecord``; ``load(PATH, ...)`` (public as ``theseus.runs.load``)
reads any mix of runs and sweeps as ``Runs``: labels, differing keys, status (running,
interrupted, failed, finished), ETA, and the metrics as rows for a notebook.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import ListConfig, OmegaConf

from theseus.config.registry import RECORD
from theseus.config.schema import flatten
from theseus.config.yaml_file import load_yaml
from theseus.training.run_files import RESULT, SAMPLES, WANDB_ID, checkpoint_steps, parse_override, resumable

METRICS = "metrics.jsonl"
SUMMARY_METRICS = ("val_loss", "tokens_per_s", "mfu")  # a job's final values in the sweep summary
FORMATS = {"loss": "{:.4f}", "val_loss": "{:.4f}", "tokens_per_s": "{:,.0f}", "mfu": "{:.2%}"}
STATUSES = ("running", "interrupted", "failed", "finished")
STALE_S = 120.0  # a run whose metrics.jsonl has not grown for this long (or 5 log intervals) is not running
LABEL_CHARS = 40  # a value longer than this is cut in a label to its last characters (a path's end tells it)


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What a run directory recorded: its overrides, config and logged metrics."""

    path: Path
    overrides: tuple[str, ...]
    config: dict[str, Any]
    metrics: tuple[dict[str, Any], ...]

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        hydra = path / ".hydra"
        overrides = load_yaml(hydra / "overrides.yaml", ListConfig) if (hydra / "overrides.yaml").is_file() else []
        config = OmegaConf.to_container(load_yaml(hydra / "config.yaml"))
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

    @property
    def step(self) -> int:
        """The step it reached: the last logged one, or its last checkpoint's where that is later
        (a run stopped by Ctrl-C saves the step it was on; its last log may be before it). 0
        before either."""
        logged = max((row["step"] for row in self.metrics if "step" in row), default=0)
        return max([logged, *checkpoint_steps(self.path)])

    @property
    def max_steps(self) -> int | None:
        value = self.config.get("trainer", {}).get("max_steps")
        return value if isinstance(value, int) else None

    @property
    def result(self) -> dict[str, Any]:
        """``result.json``: the status and error a job recorded when it ended (empty: none)."""
        path = self.path / RESULT
        try:
            return json.loads(path.read_text()) if path.is_file() else {}
        except json.JSONDecodeError:
            return {}

    @property
    def samples(self) -> list[dict[str, Any]]:
        """The examples the latest evaluation showed (``samples.jsonl``: a GRPO run's prompts,
        completions and rewards), each with its ``step``; empty when it logged none."""
        rows = read_metrics(self.path / SAMPLES)
        latest = max((row.get("step", 0) for row in rows), default=None)
        return [row for row in rows if row.get("step", 0) == latest]

    def elapsed(self) -> dict[int, float]:
        """Training seconds at each logged step: the sum of ``step_time`` x steps since the
        previous log (compilation and evaluation left out; the metrics hold no wall clock)."""
        times, total, previous = {}, 0.0, 0
        for row in self.metrics:
            if row.get("step_time") is not None and row.get("step", 0) > previous:
                total += row["step_time"] * (row["step"] - previous)
                previous = row["step"]
                times[previous] = total
        return times

    def seconds_per_step(self, window: int = 5) -> float | None:
        """The mean ``step_time`` of the last ``window`` logs."""
        recent = [row["step_time"] for row in self.metrics if row.get("step_time") is not None][-window:]
        return sum(recent) / len(recent) if recent else None

    def status(self, now: float | None = None) -> str:
        """``failed`` (its result says so), ``finished`` (at max_steps, or its result says ok),
        ``running`` (metrics.jsonl grew lately), else ``interrupted`` (stopped short: resumable)."""
        recorded = self.result.get("status")
        if recorded == "failed":
            return "failed"
        if recorded == "ok" or (self.max_steps is not None and self.step >= self.max_steps):
            return "finished"
        metrics = self.path / METRICS
        if not metrics.is_file():
            return "running" if (now or time.time()) - self.path.stat().st_mtime < STALE_S else "interrupted"
        pace = self.seconds_per_step()
        steps = sorted({row["step"] for row in self.metrics if "step" in row})
        interval = pace * (steps[-1] - steps[-2]) if pace and len(steps) > 1 else 0.0
        quiet = (now or time.time()) - metrics.stat().st_mtime
        return "running" if quiet < max(STALE_S, 5 * interval) else "interrupted"

    def eta(self, now: float | None = None) -> float | None:
        """Seconds to max_steps at the recent pace, for a running run (else None)."""
        pace = self.seconds_per_step()
        if self.status(now) != "running" or pace is None or self.max_steps is None:
            return None
        return max(self.max_steps - self.step, 0) * pace

    @property
    def name(self) -> str | None:
        """``logger.name`` when the run was given one."""
        name = self.config.get("logger", {}).get("name")
        return str(name) if name else None

    @property
    def identity(self) -> tuple[Path, str | None]:
        """What makes two paths one run: its real directory, and its W&B run id (None without W&B)."""
        wandb_id = self.path / WANDB_ID
        return self.path.resolve(), wandb_id.read_text(encoding="utf-8").strip() if wandb_id.is_file() else None


def varying(items: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys whose values are not the same in every mapping, a missing key counting as a value
    (in first-seen order; none for fewer than two)."""
    keys = dict.fromkeys(key for item in items for key in item)
    return [key for key in keys if len({repr(item.get(key)) for item in items}) > 1]


def differing(configs: Sequence[dict[str, Any]]) -> list[str]:
    """The flattened config keys whose values are not the same in every config (in first-seen order)."""
    return varying([flatten(config) for config in configs])


def label(values: Mapping[str, Any]) -> str:
    """``optimizer.lr=0.001, trainer.seed=0``: the keys sorted, each value as the summary writes
    it (one longer than ``LABEL_CHARS`` cut to its end); a key without a value (None: not set) left out."""
    cells = {key: fmt(key, value) for key, value in sorted(values.items()) if value is not None}
    return ", ".join(f"{key}={cell if len(cell) <= LABEL_CHARS else '…' + cell[1 - LABEL_CHARS:]}"
                     for key, cell in cells.items())


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
    status: str  # ok, failed, preempted (stopped by a signal or its scheduler), or unfinished (no result yet)
    error: str
    val_loss: float | None
    tokens_per_s: float | None
    mfu: float | None
    resumable: bool = False  # not ok, and a checkpoint to resume from

    @classmethod
    def load(cls, path: Path) -> Job:
        run = RunRecord.load(path)
        result = json.loads((path / RESULT).read_text()) if (path / RESULT).is_file() else {}
        status = result.get("status", "unfinished")
        return cls(path.name, run.params, status, result.get("error", ""),
                   *(run.last(key) for key in SUMMARY_METRICS), resumable=status != "ok" and resumable(path))


def collect(sweep_dir: Path) -> list[Job]:
    """Every job of the sweep folder, in job order."""
    return [Job.load(path) for path in job_dirs(sweep_dir)]


def swept(jobs: Sequence[Job]) -> list[str]:
    """The override keys whose value differs between jobs (all of them for a single job)."""
    params = [job.params for job in jobs]
    return list(dict.fromkeys(key for p in params for key in p)) if len(jobs) < 2 else varying(params)


def rows(jobs: Sequence[Job]) -> list[dict[str, Any]]:
    """One flat row per job: job, the swept values, the metrics, status, error."""
    keys = swept(jobs)
    return [{"job": job.name, **{key: job.params.get(key) for key in keys},
             **{key: getattr(job, key) for key in SUMMARY_METRICS}, "status": job.status,
             "resumable": job.resumable, "error": job.error}
            for job in jobs]


def fmt(column: str, value: Any) -> str:
    """A summary cell as text: losses to 4 decimals, tokens/s whole, MFU in percent."""
    if value is None:
        return ""
    if column in FORMATS:
        return FORMATS[column].format(value)
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def run_paths(path: Path) -> list[Path]:
    """The run directories at ``path``: itself, or a sweep's jobs in job order then every other run
    below it (``outputs/``: its named runs, ``outputs/tiny``, and Hydra's ``outputs/DATE/TIME``)."""
    if is_run(path):
        return [path]
    jobs = job_dirs(path)
    below = sorted(config.parent.parent for config in path.rglob(".hydra/config.yaml"))
    return jobs + [run for run in below if run not in set(jobs)]


@dataclasses.dataclass(frozen=True)
class Runs(Sequence[RunRecord]):
    """Several runs read together (one run, a sweep, or any mix): each one's label, the config
    keys in which they differ, and their metrics as rows."""

    runs: tuple[RunRecord, ...]

    def __getitem__(self, index):  # noqa: ANN001 (an int or a slice, as a Sequence takes)
        return self.runs[index]

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[RunRecord]:
        return iter(self.runs)

    @functools.cached_property
    def differing(self) -> list[str]:
        """The config keys whose values differ between the runs, ``logger.*`` aside (where a
        run logs to does not change what it trains)."""
        return [key for key in differing([run.config for run in self.runs]) if not key.startswith("logger.")]

    def differences(self, run: RunRecord) -> dict[str, Any]:
        """``run``'s values of the differing keys."""
        flat = flatten(run.config)
        return {key: flat.get(key) for key in self.differing}

    @functools.cached_property
    def _given(self) -> list[dict[str, Any]]:
        """Each run's value of every command-line key any of the runs sets: its own override,
        else what its config holds there (the key's value, or the option its group chose; None:
        neither, as ``experiment`` for a run without one)."""
        keys = dict.fromkeys(key for run in self.runs for key in run.params)
        return [{key: run.params[key] if key in run.params else configured(run, key) for key in keys}
                for run in self.runs]

    @functools.cached_property
    def varied(self) -> list[str]:
        """The command-line keys (the runs' overrides as Hydra parses them: ``experiment``,
        ``optimizer.lr``) whose values differ between the runs, sorted, ``logger.*`` aside: what
        tells the runs apart in a few words, where one experiment's choice changes dozens of
        config keys. A run that does not set a key has its config's value of it: a single run and
        a sweep's job of the same config do not differ."""
        return sorted(key for key in varying(self._given) if not key.startswith("logger."))

    def settings(self, run: RunRecord) -> dict[str, Any]:
        """``run``'s values of the varied keys (its override, else its config's; None: neither)."""
        given = self._given[self.runs.index(run)]
        return {key: given.get(key) for key in self.varied}

    def labels(self) -> list[str]:
        """A name per run: ``logger.name``, else the varied keys its command line sets
        (``optimizer.lr=0.001``: what its user typed), else its folder below the runs' common
        folder; a name two runs share gets the folder too."""
        tails = _tails([run.path for run in self.runs])
        typed = [{key: run.params.get(key) for key in self.varied} for run in self.runs]
        labels = [run.name or label(keys) or tail for run, keys, tail in zip(self.runs, typed, tails)]
        return [f"{name} ({tail})" if labels.count(name) > 1 and name != tail else name
                for name, tail in zip(labels, tails)]

    def summary(self, now: float | None = None) -> list[dict[str, Any]]:
        """One row per run: run (its label), path, status, step, max_steps, eta_s, the
        differing keys, and the last loss, val_loss, tokens_per_s and mfu."""
        return [{"run": label, "path": str(run.path), "status": run.status(now), "step": run.step,
                 "max_steps": run.max_steps, "eta_s": run.eta(now), **self.differences(run),
                 **{key: run.last(key) for key in ("loss", *SUMMARY_METRICS)}}
                for label, run in zip(self.labels(), self.runs)]

    def metrics(self) -> list[dict[str, Any]]:
        """Every logged row of every run, with ``run`` (its label) and the differing keys."""
        return [{"run": label, **self.differences(run), **row}
                for label, run in zip(self.labels(), self.runs) for row in run.metrics]

    def dataframe(self, which: str = "metrics"):  # -> pandas.DataFrame
        """``metrics()`` (or ``summary()`` for ``which="summary"``) as a pandas DataFrame."""
        import pandas  # optional: only this method needs it

        return pandas.DataFrame(self.metrics() if which == "metrics" else self.summary())


def configured(run: RunRecord, key: str) -> Any:
    """What ``run``'s config holds for command-line key ``key``: a config key's value, or the
    option a group (``model``, ``optimizer``) chose, from the config's ``choices``; None: neither."""
    flat = flatten(run.config)
    return flat.get(key, flat.get(f"{RECORD}.{key}"))


def load(*paths: Path | str, empty_ok: bool = False) -> Runs:
    """The runs at ``paths`` (run directories, sweep folders, folders of runs), in order, each
    once however often it is reached (a sweep and one of its jobs, a link, a copy: its real
    directory or W&B id seen before). ValueError when a path holds none (unless ``empty_ok``: a
    sweep whose jobs have not started, or whose folder is not made yet)."""
    found: list[RunRecord] = []
    seen: set[Path | str] = set()
    for path in map(Path, paths):
        runs = run_paths(path) if path.is_dir() else []
        if not runs and not (empty_ok and not path.is_file()):
            raise ValueError(f"{path} is neither a run directory (with .hydra/config.yaml) nor a folder of runs "
                             "(a sweep's 0/, 1/, ... or outputs/DATE/TIME/)")
        for run in map(RunRecord.load, runs):
            if seen.isdisjoint(key for key in run.identity if key is not None):
                found.append(run)
                seen.update(key for key in run.identity if key is not None)
    return Runs(tuple(found))


def _tails(paths: Sequence[Path]) -> list[str]:
    """Each path below the paths' common folder (a lone run: its last two parts, DATE/TIME)."""
    resolved = [path.resolve() for path in paths]
    if len(resolved) == 1:
        return ["/".join(resolved[0].parts[-2:])]
    shared = itertools.takewhile(lambda parts: len(set(parts)) == 1, zip(*(p.parts for p in resolved)))
    common = Path(*(parts[0] for parts in shared))
    return [str(path.relative_to(common)) or path.name for path in resolved]
