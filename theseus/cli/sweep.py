"""The summary of a multirun sweep: swept values -> final val_loss, tokens/s, MFU, status;
with ``trainer.seed`` (or ``data.seed``) swept beside other keys, the seed groups too: each
setting's mean val_loss, its 95% interval, and Welch's p-value that the best group is lower.

``SweepSummary`` is a Hydra callback (wired in ``conf/config.yaml``). Each job records its
status in ``result.json`` in its run directory and rewrites ``summary.csv`` and
``summary.json`` in the sweep folder, so the summary is complete however the sweep ends, with
any launcher (jobs may run in other processes or on other hosts). At the end the table is
printed.
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import dataclasses
import io
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig
from rich.table import Table

from theseus.config import PLANNING, ConfigError, keys_with
from theseus.report.records import SUMMARY_METRICS, Job, RunRecord, collect, fmt, label, rows, swept
from theseus.report.seeds import LEVEL, Group, seed_groups, seed_keys
from theseus.training.commands import runs_elsewhere
from theseus.training.config import TrainerConfig
from theseus.training.console import TRANSCRIPT, console_for, console_off
from theseus.training.metrics import format_duration
from theseus.training.run_files import RESULT, error_line


def write(sweep_dir: Path, jobs: Sequence[Job]) -> None:
    """Write summary.csv and summary.json into the sweep folder (each replaced atomically)."""
    table = rows(jobs)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(table[0]) if table else ["job"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    document = {"swept": swept(jobs), "jobs": [dataclasses.asdict(job) for job in jobs],
                "seed_groups": [{**dataclasses.asdict(group), "n": group.n} for group in groups(jobs)]}
    _replace(sweep_dir / "summary.csv", text.getvalue())
    _replace(sweep_dir / "summary.json", json.dumps(document, indent=2) + "\n")


def table(jobs: Sequence[Job]) -> Table:
    """The summary as a rich table (errors are printed beneath it, whole)."""
    failed = sum(job.status == "failed" for job in jobs)
    preempted = sum(job.status == "preempted" for job in jobs)
    out = Table(title=f"sweep: {len(jobs)} jobs, {failed} failed" + (f", {preempted} preempted" if preempted else ""),
                title_justify="left")
    body = rows(jobs)
    columns = [key for key in body[0] if key != "error"]
    for column in columns:
        out.add_column(column, justify="right" if column in SUMMARY_METRICS else "left")
    for row in body:
        style = {"failed": "red", "unfinished": "yellow", "preempted": "yellow"}.get(row["status"])
        out.add_row(*(fmt(column, row[column]) for column in columns), style=style)
    return out


def groups(jobs: Sequence[Job]) -> list[Group]:
    """The seed groups of the jobs that finished with a val_loss (by their swept values)."""
    keys = swept(jobs)
    done = [job for job in jobs if job.status == "ok" and job.val_loss is not None]
    return seed_groups([({key: job.params.get(key) for key in keys}, job.val_loss) for job in done])


def group_table(jobs: Sequence[Job]) -> Table | str | None:
    """The seed groups as a table; with no seed swept, the line saying it is a single seed."""
    found = groups(jobs)
    if len(found) < 2:
        return None
    if not seed_keys([job.params for job in jobs]):
        return ("single seed: each setting ran once, so these differences are not tested against seed noise "
                "(sweep trainer.seed=0,1,2 beside the other keys for intervals and p-values)")
    out = Table(title=f"seed groups: val_loss mean +- {LEVEL:.0%} interval; p: Welch's t-test that the best is lower",
                title_justify="left")
    for column in ("group", "seeds", "val_loss", "p"):
        out.add_column(column, justify="left" if column == "group" else "right")
    for i, group in enumerate(found):
        p = "best" if i == 0 else "n/a" if group.p is None else f"{group.p:.2g}"
        out.add_row(label(group.params) or "all", str(group.n), group.describe(), p, style="green" if i == 0 else None)
    return out


class QuietJoblib(logging.Filter):
    """Drops the joblib launcher's ``Joblib.Parallel(n_jobs=-1, ...) is launching N jobs`` line
    (its settings are the config's; the jobs are listed beside it), keeping its other lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Joblib.Parallel(")


def quiet_jobs(hydra_config: DictConfig) -> bool:
    """Whether each job of this sweep shows one line (``one_line``) rather than its whole run: a
    multirun run on this machine (a remote launcher's jobs each write files of their own) whose
    console, stderr, is no terminal (a log, a pipe: 176 lines for four tiny jobs, else)."""
    return (hydra_config.mode == RunMode.MULTIRUN and not runs_elsewhere(hydra_config.launcher)
            and not sys.stderr.isatty())


class QuietLaunches(logging.Filter):
    """Drops a local launcher's ``Launching N jobs locally`` and ``#N : OVERRIDES`` lines when
    its jobs are quiet (stderr no terminal): the sweep's first line (``announce``) says where its
    jobs go, and each job's own line (``one_line``) names it, with how it ended. (Optuna launches
    each batch of trials apart: eight ``Launching 1 jobs`` lines, else.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        return sys.stderr.isatty() or not record.getMessage().lstrip().startswith(("#", "Launching"))


def announce(config: DictConfig) -> None:
    """A quiet sweep's first line (``quiet_jobs``): where its jobs go and where each one's console is."""
    if quiet_jobs(config.hydra):
        print(f"sweep into {config.hydra.sweep.dir}: a line per job as it ends, each job's "
              f"whole console in its run.log", file=sys.stderr, flush=True)


def plain_optuna_lines(config: DictConfig) -> None:
    """Optuna (2.x, which Hydra's sweeper pins) colours its log lines whatever its stream is: off a
    terminal, its handler writes them without the colour codes."""
    if "optuna" not in str(config.hydra.sweeper.get("_target_", "")).lower() or sys.stderr.isatty():
        return
    import optuna  # the sweeper imports it next

    for handler in optuna.logging.get_logger("optuna").handlers:
        handler.setFormatter(logging.Formatter("[%(levelname)1.1s %(asctime)s] %(message)s"))


@contextlib.contextmanager
def one_line(hydra_config: DictConfig) -> Iterator[None]:
    """A quiet sweep's job (``quiet_jobs``): inside, what it shows goes to its run.log alone
    (``console_off``); when it ends, one line on the console: its number, its overrides and how
    it ended (its step, val_loss, tokens/s and MFU; its error; the signal that stopped it)."""
    run_dir, start = Path(hydra_config.runtime.output_dir), time.monotonic()
    shown = run_dir.relative_to(Path.cwd()) if run_dir.is_relative_to(Path.cwd()) else run_dir
    ended = "ended"
    try:
        with console_off(run_dir / TRANSCRIPT):
            yield
        ended = finished(run_dir)
    except SystemExit as exc:  # a signal's 128 + N: stopped after a step, its checkpoint saved
        code = exc.code if isinstance(exc.code, int) else 1
        ended = (f"interrupted by {signal.Signals(code - 128).name}: its run.log ends with the command that "
                 f"resumes it" if code > 128 else f"exited ({exc.code})")
        raise
    except Exception as exc:
        ended = f"failed: {error_line(exc)}"
        raise
    finally:
        print(f"#{hydra_config.job.num} {' '.join(hydra_config.overrides.task)}: {ended} "
              f"({format_duration(time.monotonic() - start)}, {shown})", file=sys.stderr, flush=True)


def finished(run_dir: Path) -> str:
    """``step 20/20, val_loss 3.6566, 20,366 tokens/s, MFU 8.12%``: a finished job's end, as its
    run directory recorded it (``done`` where it recorded none: a job of its own, a damaged record)."""
    try:
        run = RunRecord.load(run_dir)
    except (ConfigError, OSError):
        return "done"
    shown = {"val_loss": "val_loss {}", "tokens_per_s": "{} tokens/s", "mfu": "MFU {}"}
    done = [f"step {run.step}/{run.max_steps}"] if run.max_steps else ["done"]
    return ", ".join(done + [shown.get(key, f"{key} {{}}").format(fmt(key, run.last(key))) for key in SUMMARY_METRICS
                             if run.last(key) is not None])


def print_summary(sweep_dir: Path | str) -> list[Job]:
    """Write the sweep folder's summary files and print its table; returns its jobs."""
    sweep_dir = Path(sweep_dir)
    jobs = collect(sweep_dir)
    if not jobs:
        return jobs
    write(sweep_dir, jobs)
    summary, seeds = table(jobs), group_table(jobs)
    console = console_for(summary, *([seeds] if isinstance(seeds, Table) else []))
    console.print(summary)
    if isinstance(seeds, Table):
        console.print(seeds, markup=False, highlight=False)
    lines = [(seeds, None)] if isinstance(seeds, str) else []
    lines += [(f"job {job.name} {job.status}: {job.error}", "red") for job in jobs if job.error]
    lines += [(f"summary: {sweep_dir / 'summary.csv'}, {sweep_dir / 'summary.json'}", None)]
    for line, style in lines:  # each whole on its line (soft_wrap: a terminal wraps it, a log keeps it)
        console.print(line, style=style, markup=False, highlight=False, soft_wrap=True)
    return jobs


def runnable(job: Sequence[str]) -> list[str]:
    """A planned point's overrides less the keys declared ``role=PLANNING`` (trainer.dry_run,
    trainer.plan_file, mesh.target): what runs it on its target."""
    from theseus.base.mesh import MeshConfig  # imports JAX: only a planned sweep's end pays for it

    planning = keys_with(PLANNING, TrainerConfig, MeshConfig)
    return [o for o in job if o.lstrip("+~").split("=")[0] not in planning]


def print_plans(jobs: Sequence[Sequence[str]], plans: Sequence[dict]) -> None:
    """A planned sweep (``trainer.dry_run=true mesh.target=...``) as one table: each point's
    swept overrides (``jobs``: each job's overrides), whether it fits, its memory per chip, its
    predicted step time and chip-hours (``trainer.max_steps`` steps)."""
    from theseus.training.metrics import format_bytes

    shared = set.intersection(*(set(job) for job in jobs))
    out = Table(title=f"plan: {len(plans)} points (predicted, not measured)", title_justify="left")
    for column in ("point", "target", "fits", "memory / chip", "step time (predicted)", "chip-hours (predicted)"):
        out.add_column(column, justify="left" if column in ("point", "target", "fits") else "right")
    for job, plan in zip(jobs, plans):
        fits = {True: "yes", False: "NO", None: ""}[plan["fits"]]
        point = " ".join(o for o in runnable(job) if o not in shared) or "all"
        out.add_row(point, plan["target"] or "this machine", fits,
                    format_bytes(plan["memory"]) + (f" of {format_bytes(plan['limit'])}" if plan["limit"] else "")
                    if plan["memory"] else "",
                    f"{plan['step_s'] * 1e3:.4g} ms" if plan["step_s"] else "",
                    f"{plan['chip_hours']:.3g}" if plan["chip_hours"] is not None else "",
                    style=None if plan["fits"] is not False else "red")
    console_for(out).print(out)


def write_plan(path: Path | str, jobs: Sequence[Sequence[str]], plans: Sequence[dict]) -> None:
    """``trainer.plan_file``: one JSON line per point (``jobs``: each job's overrides), with the
    overrides that run it on its target (the planning keys dropped), and its plan: target,
    fits, memory and limit (bytes per chip), predicted step_s and chip_hours. Replaced whole."""
    lines = [json.dumps({"overrides": runnable(job), **plan}) for job, plan in zip(jobs, plans)]
    _replace(Path(path), "".join(line + "\n" for line in lines))


def log_groups(config: DictConfig, sweep_dir: Path, jobs: Sequence[Job]) -> None:
    """With seeds swept and W&B on (``logger.mode``), a W&B run ``seed groups`` in the sweep's
    group (its jobs' group): a table of each group's mean, interval and p-value, and the same
    in its summary (``seed_groups/GROUP/mean``, ``.../ci95``, ``.../p``)."""
    logger = config.get("logger") or {}
    found = groups(jobs)
    if logger.get("mode", "disabled") == "disabled" or len(found) < 2 or not seed_keys([job.params for job in jobs]):
        return
    import wandb  # here: only a seeded sweep with W&B on pays for the import

    labels = [label(group.params) or "all" for group in found]
    settings = wandb.Settings(console="off", save_code=False, disable_git=True, silent=True, x_disable_stats=True,
                              x_disable_machine_info=True, x_save_requirements=False)
    run = wandb.init(mode=logger.mode, dir=str(sweep_dir), project=logger.get("project", "theseus"),
                     group=str(sweep_dir)[-128:], job_type="seed-groups", name=f"seed groups {sweep_dir.name}",
                     settings=settings)
    columns = ["group", "seeds", "mean", "ci95", "p_best_lower"]
    run.log({"seed_groups": wandb.Table(columns=columns, data=[[text, g.n, g.mean, g.ci, g.p]
                                                               for text, g in zip(labels, found)])})
    run.summary.update({f"seed_groups/{text}/{name}": value for text, g in zip(labels, found)
                        for name, value in (("mean", g.mean), ("ci95", g.ci), ("p", g.p), ("n", g.n))
                        if value is not None})
    run.finish()
    wandb.teardown()


class SweepSummary(Callback):
    """Records every job of a multirun and prints the summary table at the end."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        announce(config)
        plain_optuna_lines(config)
        # Hydra's BasicSweeper re-raises a failed job's error once the batch has run, and then
        # skips on_multirun_end: the table is printed as the process exits instead.
        atexit.register(self._finish, config)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        failed = job_return.status == JobStatus.FAILED
        # JobReturn.return_value re-raises a failure; the exception itself is _return_value.
        result = {"status": "failed" if failed else "ok",
                  "error": error_line(job_return._return_value) if failed else ""}
        _replace(Path(config.hydra.runtime.output_dir) / RESULT, json.dumps(result) + "\n")
        sweep_dir = Path(config.hydra.sweep.dir)
        write(sweep_dir, collect(sweep_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        atexit.unregister(self._finish)
        self._finish(config)

    @staticmethod
    def _finish(config: DictConfig) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        log_groups(config, sweep_dir, print_summary(sweep_dir))


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (parallel jobs rewrite the same summary)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    try:
        os.replace(partial, path)
    except OSError:
        partial.unlink()
        raise
