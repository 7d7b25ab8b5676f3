"""What the report shows, as one JSON-able document: each run's identity, status and series,
a sweep's summary, parallel coordinates and seed groups. The page's script draws it; the
live server sends it again as runs grow."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from theseus.report.records import RunRecord, Runs, fmt, label, load
from theseus.report.seeds import LEVEL, seed_groups, seed_keys
from theseus.training.metrics import format_duration

# Charts in this order first, then every other logged key alphabetically; these are never charted.
CHARTS = {"loss": "train loss", "val_loss": "val loss", "tokens_per_s": "throughput (tokens/s)",
          "mfu": "model FLOPs utilisation", "lr": "learning rate", "grad_norm": "gradient norm"}
HIDDEN = {"step", "step_time", "data_wait", "flops_per_s"}
FORMATS = {"mfu": ".1%", "tokens_per_s": ".3s", "lr": ".2e"}  # d3 formats of the y axis and hover values
FINAL = "val_loss"  # the metric a sweep compares


def document(paths: Sequence[Path | str], now: float | None = None, empty_ok: bool = False) -> dict[str, Any]:
    """The report of the runs at ``paths`` (run directories, sweep folders; ``empty_ok``: folders
    without a run yet are no error)."""
    now = time.time() if now is None else now
    runs = load(*paths, empty_ok=empty_ok)
    summary = runs.summary(now)
    return {
        "title": title(paths, runs),
        "paths": [str(Path(path).resolve()) for path in paths],
        "differing": runs.varied,
        "charts": charts(runs),
        "runs": [run_entry(run, row, runs.settings(run)) for run, row in zip(runs, summary)],
        "parallel": parallel(runs, summary),
        "seeds": seeds(runs, summary),
        "updated": now,
    }


def title(paths: Sequence[Path | str], runs: Runs) -> str:
    """A run's label, ``sweep DATE/TIME`` for one sweep, ``N runs`` for several paths."""
    if len(paths) == 1 and len(runs) == 1:
        return runs.labels()[0]
    if len(paths) == 1:
        return f"sweep {'/'.join(Path(paths[0]).resolve().parts[-2:])}"
    return f"{len(runs)} runs"


def charts(runs: Runs) -> list[dict[str, str]]:
    """One chart per logged metric: key, title and number format."""
    keys = {key for run in runs for row in run.metrics for key, value in row.items()
            if key not in HIDDEN and isinstance(value, int | float)}
    ordered = [key for key in CHARTS if key in keys] + sorted(keys - set(CHARTS))
    return [{"key": key, "title": CHARTS.get(key, key), "format": FORMATS.get(key, ".4g")} for key in ordered]


def run_entry(run: RunRecord, row: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """One run: label, status, step of max_steps, ETA, its values of the varied keys
    (``settings``), and its series as
    ``key -> [[step, tokens, seconds, value], ...]`` (tokens/seconds null where unknown)."""
    seconds = run.elapsed()
    per_step = run.tokens_per_step
    series: dict[str, list[list[float | None]]] = {}
    for metrics in run.metrics:
        step = metrics.get("step")
        for key, value in metrics.items():
            if key in HIDDEN or not isinstance(value, int | float) or step is None:
                continue
            series.setdefault(key, []).append([step, step * per_step if per_step else None, seconds.get(step), value])
    return {
        "label": row["run"], "path": row["path"], "status": row["status"], "step": row["step"],
        "max_steps": row["max_steps"], "eta": format_duration(row["eta_s"]) if row["eta_s"] is not None else None,
        "error": run.result.get("error", ""),
        "differs": {key: fmt(key, value) for key, value in settings.items()},
        "final": {key: fmt(key, row[key]) for key in ("loss", "val_loss", "tokens_per_s", "mfu")},
        "sort": {key: value if isinstance(value, int | float | str) else fmt(key, value)
                 for key, value in (*settings.items(), *((key, row.get(key)) for key in
                                                        ("loss", "val_loss", "tokens_per_s", "mfu", "step")))},
        "series": series,
        "samples": run.samples,
    }


def parallel(runs: Runs, summary: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Plotly parallel-coordinates dimensions: each varied key, then the final val_loss,
    over the runs that logged one. Numbers spanning 10x or more go on a log10 axis;
    other values are categories in order of appearance. None without two such runs."""
    done = [(runs.settings(run), row) for run, row in zip(runs, summary) if row.get(FINAL) is not None]
    rows = [row for _, row in done]
    if len(rows) < 2 or not runs.varied:
        return None
    dimensions = [_dimension(key, [settings[key] for settings, _ in done]) for key in runs.varied]
    dimensions.append(_dimension(FINAL, [row[FINAL] for row in rows], log=False))
    return {"dimensions": dimensions, "color": [row[FINAL] for row in rows], "runs": [row["run"] for row in rows]}


def seeds(runs: Runs, summary: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The seed groups of the runs that finished with a val_loss (best first), grouped by their
    varied keys but the seeds, or None below two runs."""
    done = [(runs.settings(run), row) for run, row in zip(runs, summary)
            if row.get(FINAL) is not None and row["status"] == "finished"]
    if len(done) < 2:
        return None
    seeded = seed_keys([settings for settings, _ in done])
    groups = seed_groups([(settings, row[FINAL]) for settings, row in done])
    return {
        "metric": FINAL, "level": LEVEL, "seeds": seeded,
        "single_seed": all(group.n == 1 for group in groups),
        "groups": [{"label": label(group.params) or ("all runs" if len(groups) == 1 else "defaults"),
                    "n": group.n, "mean": group.mean, "ci": group.ci, "p": group.p, "t": group.t, "df": group.df,
                    "text": group.describe()} for group in groups],
    }


def _dimension(key: str, values: Sequence[Any], log: bool = True) -> dict[str, Any]:
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if numeric:
        spread = log and min(values) > 0 and max(values) >= 10 * min(values)
        if not spread:
            return {"label": key, "values": list(values)}
        ticks = sorted(set(values))
        return {"label": f"{key} (log)", "values": [math.log10(v) for v in values],
                "tickvals": [math.log10(v) for v in ticks], "ticktext": [fmt(key, v) for v in ticks]}
    order = list(dict.fromkeys(fmt(key, v) for v in values))
    return {"label": key, "values": [order.index(fmt(key, v)) for v in values],
            "tickvals": list(range(len(order))), "ticktext": order}
