"""The report's charts as PNG bytes: curves of one or more runs, and a sweep's final metric.

Figures are built with matplotlib's object API (no pyplot, no global backend), so rendering
works headless and leaves no state behind.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import EngFormatter, Formatter, LogLocator, NullFormatter, PercentFormatter

from theseus.training.runs import Job, Run, fmt

STYLE = {
    "figure.figsize": (6.4, 3.6),
    "figure.dpi": 120,
    "font.size": 9,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.titlepad": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e4e4e4",
    "grid.linewidth": 0.8,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "lines.linewidth": 1.6,
}
FAILED = "#d62728"
SPLITS = {"loss": {"alpha": 0.85}, "val_loss": {"linestyle": "--", "marker": "o", "markersize": 3.5}}  # train, val

Labelled = Sequence[tuple[str, Run]]  # (legend label, run)


def png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def loss(runs: Labelled, against: str = "steps") -> bytes | None:
    """Train loss (solid) and val loss (dashed, dots) against ``steps`` or ``tokens``."""
    scales = [1 if against == "steps" else run.tokens_per_step for _, run in runs]
    if not any(scale and run.series(key)[0] for scale, (_, run) in zip(scales, runs) for key in SPLITS):
        return None
    with matplotlib.rc_context(STYLE):
        fig = Figure(layout="constrained")
        ax = fig.add_subplot(title=f"loss against {against}", xlabel="step" if against == "steps" else against, ylabel="loss")
        for color, scale, (label, run) in zip(_colors(len(runs)), scales, runs):
            if not scale:  # tokens: the config lacks batch_size or seq_len
                continue
            for key, style in SPLITS.items():
                steps, values = run.series(key)
                ax.plot([s * scale for s in steps], values, color=color, label=label if key == "loss" else None,
                        **{**style, **_visible(len(steps))})
        if against == "tokens":
            ax.xaxis.set_major_formatter(EngFormatter())
        splits = [Line2D([], [], color="0.3", label=name, **style) for name, style in zip(("train", "val"), SPLITS.values())]
        _legend(fig, len(runs), splits)
        return png(fig)


def metric(runs: Labelled, key: str, title: str, formatter: Formatter | str | None = None) -> bytes | None:
    """One logged metric of every run against steps, its axis from zero."""
    if not any(run.series(key)[0] for _, run in runs):
        return None
    with matplotlib.rc_context(STYLE):
        fig = Figure(layout="constrained")
        ax = fig.add_subplot(title=title, xlabel="step")
        for color, (label, run) in zip(_colors(len(runs)), runs):
            steps, values = run.series(key)
            ax.plot(steps, values, color=color, label=label, **_visible(len(steps)))
        if formatter:
            ax.yaxis.set_major_formatter(formatter)
        ax.set_ylim(bottom=0)
        _legend(fig, len(runs))
        return png(fig)


def family(runs: Labelled, prefix: str, suffix: str, title: str,
           formatter: Formatter | str | None = None) -> bytes | None:
    """Every logged ``PREFIX NAME SUFFIX`` series (each mixture source's val_loss, each task's
    accuracy) against steps, one line per name and run."""
    keys = sorted({key for _, run in runs for row in run.metrics for key in row
                   if key.startswith(prefix) and key.endswith(suffix) and len(key) > len(prefix + suffix)})
    if not keys:
        return None
    with matplotlib.rc_context(STYLE):
        fig = Figure(layout="constrained")
        ax = fig.add_subplot(title=title, xlabel="step")
        for color, key in zip(_colors(len(keys)), keys):
            name = key[len(prefix):len(key) - len(suffix)]
            for (label, run), style in zip(runs, ("-", "--", ":", "-.") * len(runs)):
                ax.plot(*run.series(key), color=color, linestyle=style, marker="o", markersize=3,
                        label=f"{label} {name}".strip())
        if formatter:
            ax.yaxis.set_major_formatter(formatter)
        _legend(fig, len(keys) * len(runs))
        return png(fig)


def run_charts(runs: Labelled) -> list[bytes]:
    """Every chart of a run (or an overlay of a sweep's runs) that has data."""
    charts = [
        loss(runs, "steps"),
        loss(runs, "tokens"),
        metric(runs, "tokens_per_s", "throughput (tokens/s)", EngFormatter()),
        metric(runs, "mfu", "model FLOPs utilisation", PercentFormatter(xmax=1)),
        metric(runs, "lr", "learning rate", "{x:.2g}"),
        metric(runs, "grad_norm", "gradient norm"),
        family(runs, "val_loss/", "", "validation loss per source"),
        family(runs, "eval/", "/acc", "multiple-choice accuracy", PercentFormatter(xmax=1)),
    ]
    return [chart for chart in charts if chart]


def final(jobs: Sequence[Job], key: str) -> bytes | None:
    """A sweep's final val_loss against the swept parameter ``key``; failed jobs marked."""
    values = [job.params.get(key) for job in jobs]
    numeric = all(isinstance(v, int | float) for v in values)
    position = _position(values, numeric)
    done = [(position(job.params.get(key)), job.val_loss) for job in jobs
            if job.status != "failed" and job.val_loss is not None]
    if not done:
        return None
    with matplotlib.rc_context(STYLE):
        fig = Figure(layout="constrained")
        ax = fig.add_subplot(title=f"final val_loss against {key}", xlabel=key, ylabel="val_loss")
        xs, ys = zip(*sorted(done))
        one_per_value = len({repr(v) for v in values}) == len(values)  # else other keys vary too
        ax.plot(xs, ys, color="C0", marker="o", linestyle="-" if one_per_value else "")
        best = min(done, key=lambda point: point[1])
        ax.plot(*best, marker="*", markersize=14, color="C1", linestyle="", label=f"best {best[1]:.4g}")
        for i, job in enumerate(j for j in jobs if j.status == "failed"):
            ax.axvline(position(job.params.get(key)), color=FAILED, linestyle=":", label=None if i else "failed")
        log = numeric and min(values) > 0 and max(values) >= 10 * min(values)
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(subs=(1, 3)))  # 1e-4, 3e-4, 1e-3, ...
            ax.xaxis.set_major_formatter("{x:g}")
            ax.xaxis.set_minor_formatter(NullFormatter())
        ticks = sorted(set(values), key=position)
        if not numeric or _spread([math.log10(v) if log else v for v in ticks]):  # else the scale's own ticks
            ax.set_xticks([position(v) for v in ticks], [fmt(key, v) for v in ticks])
            ax.minorticks_off()
        ax.legend()
        return png(fig)


def _legend(fig: Figure, runs: int, styles: Sequence[Line2D] = ()) -> None:
    """Which run is which (right of the chart, for several runs) and what the line styles mean."""
    if runs > 1:
        lines = fig.axes[0].get_legend_handles_labels()[0]
        fig.legend(handles=[*lines, *styles], loc="outside right upper", ncols=1 + runs // 16)
    elif styles:
        fig.legend(handles=styles, loc="outside upper right", ncols=len(styles))


def _visible(points: int) -> dict[str, Any]:
    """Line options that make a series of ``points`` show: one point is no line, so it gets a
    marker (a run shorter than ``trainer.log_every`` logs once)."""
    return {"marker": "o", "markersize": 4} if points == 1 else {}


def _spread(xs: Sequence[float]) -> bool:
    """Whether ticks at ``xs`` (sorted) would stand apart: at least an eighth of the span each."""
    span = xs[-1] - xs[0]
    return span > 0 and all(b - a >= span / 8 for a, b in zip(xs, xs[1:]))


def _position(values: Sequence[Any], numeric: bool) -> Callable[[Any], float]:
    """Where a parameter value goes on the x axis (categories: in order of appearance)."""
    if numeric:
        return float
    order = {label: i for i, label in enumerate(dict.fromkeys(str(v) for v in values))}
    return lambda value: order[str(value)]


def _colors(n: int) -> list[Any]:
    """Distinct colors: the default cycle for up to 10, then a continuous map."""
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    cmap = matplotlib.colormaps["viridis"]
    return [cmap(i / (n - 1) * 0.9) for i in range(n)]

