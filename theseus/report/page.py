"""One self-contained HTML page for a run directory or a sweep folder (PNGs embedded)."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from theseus.report import plots
from theseus.training.runs import Job, Run, collect, fmt, is_run, job_dirs, rows, swept

REPORT = "report.html"

STYLE = """
body { font: 14px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       max-width: 1320px; margin: 2rem auto; padding: 0 1.5rem; }
h1 { font-size: 1.6rem; margin-bottom: 0; } h2 { font-size: 1.2rem; margin-top: 2rem; }
.path { color: #666; margin-top: .2rem; font-family: ui-monospace, monospace; font-size: 12px; }
.facts { display: flex; flex-wrap: wrap; gap: .75rem; margin: 1rem 0; }
.fact { background: #f5f6f8; border-radius: 8px; padding: .5rem .9rem; min-width: 7rem; }
.fact b { display: block; font-size: 1.15rem; } .fact span { color: #666; font-size: 12px; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 1rem; }
.charts img { width: 100%; height: auto; border: 1px solid #eee; border-radius: 6px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: .3rem .8rem; text-align: left; border-bottom: 1px solid #e6e6e6; }
th { background: #f5f6f8; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.failed td { background: #fdecec; color: #a61b1b; } tr.unfinished td { background: #fff7e0; }
code, pre { font-family: ui-monospace, monospace; font-size: 12px; }
pre { background: #f5f6f8; padding: 1rem; border-radius: 6px; overflow-x: auto; }
"""


class ReportError(ValueError):
    """The path is neither a run directory nor a sweep folder."""


def render(path: Path | str) -> Path:
    """Write ``PATH/report.html`` for the run directory or sweep folder ``path``; returns it."""
    path = Path(path)
    if not path.exists():
        raise ReportError(f"{path} does not exist")
    if is_run(path):
        title, body = path.name, run_body(Run.load(path))
    elif job_dirs(path):
        title, body = f"sweep {path.name}", sweep_body(path)
    else:
        raise ReportError(f"{path} is neither a run directory (with .hydra/config.yaml) "
                          "nor a sweep folder (with run directories 0/, 1/, ...)")
    page = (f"<!doctype html>\n<html lang=en><head><meta charset=utf-8><title>theseus: {html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>"
            f"<div class=path>{html.escape(str(path.resolve()))}</div>\n{body}\n</body></html>\n")
    out = path / REPORT
    out.write_text(page)
    return out


def run_body(run: Run) -> str:
    """Key numbers, the charts and the composed config of one run."""
    step = run.last("step")
    tokens = step * run.tokens_per_step if step is not None and run.tokens_per_step else None
    val = run.series("val_loss")[1]
    facts = [("steps", step), ("tokens seen", tokens and f"{tokens:,}"),
             ("train loss", fmt("loss", run.last("loss"))), ("val loss", fmt("val_loss", run.last("val_loss"))),
             ("best val loss", fmt("val_loss", min(val, default=None))),
             ("tokens/s", fmt("tokens_per_s", run.last("tokens_per_s"))), ("MFU", fmt("mfu", run.last("mfu")))]
    overrides = " ".join(run.overrides) or "(none)"
    config = OmegaConf.to_yaml(run.config)
    return (f"{_facts(facts)}<p>overrides: <code>{html.escape(overrides)}</code></p>\n"
            f"{_charts(plots.run_charts([('', run)]), 'no metrics logged yet')}\n"
            f"<details><summary>config</summary><pre>{html.escape(config)}</pre></details>")


def sweep_body(path: Path) -> str:
    """Key numbers, the summary table, the final metric per swept key, and every run's curves."""
    jobs = collect(path)
    keys = swept(jobs)
    scored = [job for job in jobs if job.status == "ok" and job.val_loss is not None]
    best = min(scored, key=lambda job: job.val_loss, default=None)
    facts = [("jobs", len(jobs)), ("failed", sum(job.status == "failed" for job in jobs)),
             ("best val loss", best and fmt("val_loss", best.val_loss)),
             ("best", best and _label(best, keys))]
    finals = [plots.final(jobs, key) for key in keys]
    runs = [(_label(job, keys), Run.load(path / job.name)) for job in jobs]
    return (f"{_facts(facts)}<h2>Summary</h2>\n{_summary(jobs)}\n"
            f"<h2>Final val_loss against the swept values</h2>\n{_charts(finals, 'no job reported a val_loss')}\n"
            f"<h2>Runs</h2>\n{_charts(plots.run_charts(runs), 'no metrics logged yet')}")


def _summary(jobs: Sequence[Job]) -> str:
    table = rows(jobs)
    head = "".join(f"<th>{html.escape(column)}</th>" for column in table[0])
    body = "".join(
        f"<tr class={row['status']}>"
        + "".join(f"<td{' class=num' if isinstance(value, int | float) else ''}>{html.escape(fmt(column, value))}</td>"
                  for column, value in row.items())
        + "</tr>\n"
        for row in table)
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>"


def _label(job: Job, keys: Sequence[str]) -> str:
    label = ", ".join(f"{key}={fmt(key, job.params.get(key))}" for key in keys) or f"job {job.name}"
    return f"{label} ({job.status})" if job.status != "ok" else label


def _facts(facts: Sequence[tuple[str, object]]) -> str:
    cards = "".join(f"<div class=fact><b>{html.escape(str(value))}</b><span>{html.escape(name)}</span></div>"
                    for name, value in facts if value not in (None, ""))
    return f"<div class=facts>{cards}</div>"


def _charts(images: Sequence[bytes | None], empty: str) -> str:
    tags = "".join(f'<img alt="chart" src="data:image/png;base64,{base64.b64encode(image).decode()}">'
                   for image in images if image)
    return f"<div class=charts>{tags}</div>" if tags else f"<p>{html.escape(empty)}</p>"
