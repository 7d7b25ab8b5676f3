"""The run's record: ``metrics.jsonl``, a Weights & Biases run, console progress.

    with RunLogger(config, run_dir, resolved_config=cfg, total_steps=1000) as logger:
        logger.log(step, {"loss": 2.3, "tokens_per_s": 1.2e4, "mfu": 0.04})
        logger.summary(params=124e6)

Only the main process writes anything. W&B runs offline by default (no account, no
network): ``wandb leet RUN_DIR/wandb/latest-run`` browses it, ``sync_command`` uploads it:
each resume of a run writes one more ``offline-run-*`` segment under the same id, and
``wandb sync`` given them all uploads them in order as that one run.

W&B identity: the run's id is kept in ``RUN_DIR/wandb/run_id``, so a resumed run continues
the same W&B run; the jobs of a sweep (``-m``) share a W&B group, the sweep's folder, and the
job type ``sweep`` (a single run: ``train``); the git commit of the working directory is
recorded when it is in a repository. In W&B the metrics are grouped into sections
(``train/loss``, ``val/loss``, ``optim/lr``, ``throughput/mfu``; ``SECTIONS``), while
``metrics.jsonl`` keeps the flat names (``loss``, ``val_loss``, ``lr``, ``mfu``). A task's
examples shown at evaluations (GRPO's prompts, completions and rewards) go to ``samples.jsonl``
and a W&B table ``samples``.

W&B's service is a process of its own, and a scheduler signals every process of a job
(``scancel``, a time limit): when it has gone, the run says so once and goes on without W&B
(its segment keeps what the service had written), so a signalled run still saves its checkpoint
and ends ``interrupted``, never ``failed``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from theseus.config import ConfigError, Configurable, field
from theseus.training.console import Progress
from theseus.training.run_files import RESULT, SAMPLES, WANDB_ID, error_line, record_failure
from theseus.training.tensorboard import TensorBoard, job_hparams


@dataclasses.dataclass(frozen=True)
class LoggerConfig(Configurable):
    RESUMABLE: ClassVar[bool] = True  # every key may change on resuming: none alters the numbers

    mode: str = field("logger.mode", default="offline", choices=("offline", "online", "disabled"),
                      help="offline: local W&B run (no account); online: sync live; disabled: no W&B")
    project: str = field("logger.project", default="theseus", help="W&B project")
    name: str | None = field("logger.name", default=None, help="run name; unset: W&B picks one")
    tags: list[str] = field("logger.tags", default=[], help="W&B tags")
    tensorboard: bool = field("logger.tensorboard", default=False,
                              help="also write TensorBoard event files to RUN_DIR/tensorboard (overrides as HParams)")

    def __post_init__(self):
        if not self.project.strip() or any(c in self.project for c in "/\\#?%:"):
            raise ConfigError(f"logger.project={self.project!r} is not a W&B project name: give a non-empty name "
                              f"without / \\ # ? % :, e.g. logger.project=theseus")
        if self.name is not None and not self.name.strip():
            raise ConfigError("logger.name is empty: give the run a name, or logger.name=null to let W&B pick one")


SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
REDACTED = "<redacted>"


def secrets(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The values of environment variables whose names contain KEY, TOKEN, SECRET or
    PASSWORD, WANDB_API_KEY first, longest next (so a secret inside another goes second)."""
    names = [name for name in environ if any(marker in name.upper() for marker in SECRET_MARKERS)]
    found = sorted({environ[name] for name in names if environ[name]}, key=len, reverse=True)
    first = environ.get("WANDB_API_KEY")
    return [first, *(s for s in found if s != first)] if first else found


def scrub(value: Any, hidden: list[str]) -> Any:
    """``value`` (nested dicts, lists, strings) with every string that is, or contains, one
    of ``hidden`` redacted; containment counts for secrets of 8 characters or more."""
    if isinstance(value, Mapping):
        return {key: scrub(item, hidden) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(scrub(item, hidden) for item in value)
    if isinstance(value, str):
        for secret in hidden:
            if value == secret:
                return REDACTED
            if len(secret) >= 8:
                value = value.replace(secret, REDACTED)
    return value


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``metrics`` as Python floats (from numpy or JAX scalars); ValueError for an array."""
    out = {}
    for key, value in metrics.items():
        if np.ndim(value) != 0:
            raise ValueError(f"metric {key!r} must be a scalar, got shape {np.shape(value)}")
        out[key] = float(value)
    return out


class RunLogger:
    """Logs metrics to ``run_dir/metrics.jsonl``, to W&B (under ``run_dir/wandb``) and to the
    console. A context manager; a no-op unless ``is_main``.

    A resumed run continues ``metrics.jsonl``: lines after ``start_step`` (logged after the
    checkpoint it resumes from) are dropped, as those steps run again. ``record``: where the
    console's lines are also written (the run's transcript).
    """

    def __init__(self, config: LoggerConfig, run_dir: Path, *, resolved_config: Mapping[str, Any],
                 total_steps: int, start_step: int = 0, is_main: bool = True,
                 record: Callable[[str], None] = lambda text: None):
        self._open = is_main
        if not is_main:
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self._hidden = secrets()
        wandb_config = scrub(resolved_config, self._hidden)
        naming = scrub({"project": config.project, "name": config.name, "tags": list(config.tags)}, self._hidden)
        self._run = None
        complete = start_step >= total_steps  # a complete run run again: nothing to log, no new W&B segment
        if config.mode != "disabled" and not complete:
            self._run = _start_wandb(config.mode, run_dir, {**naming, **identity(run_dir, _sweep_dir())}, wandb_config)
        self._run_dir = run_dir
        (run_dir / RESULT).unlink(missing_ok=True)  # a new attempt: not failed (yet)
        self._tensorboard = TensorBoard(run_dir, job_hparams()) if config.tensorboard and not complete else None
        for name in (SAMPLES, "metrics.jsonl"):  # what steps after the checkpoint wrote: they run again
            if (run_dir / name).exists():
                _truncate(run_dir / name, start_step)
        path = run_dir / "metrics.jsonl"
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._progress = Progress(total_steps, start_step, record=record)

    def log(self, step: int, metrics: Mapping[str, Any], *, progress: bool = True) -> None:
        """Record ``metrics`` at ``step``: a JSON line (non-finite values as null), W&B, and
        with ``progress`` the console's progress (an evaluation is shown as a line of its own)."""
        if not self._open:
            return
        values = scalars(metrics)
        record = {"step": int(step), **{k: v if math.isfinite(v) else None for k, v in values.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self._wandb(lambda run: run.log({section(key): value for key, value in values.items()}, step=int(step)))
        if self._tensorboard is not None:
            self._tensorboard.log(int(step), {section(key): value for key, value in values.items()})
        if progress:
            self._progress.update(int(step), values)

    @property
    def live(self) -> bool:
        """Whether the console shows a live progress bar (``advance`` moves it)."""
        return self._open and self._progress.live

    def advance(self, step: int) -> None:
        """``step`` has finished, between logged steps: the progress bar moves to it."""
        if self._open:
            self._progress.advance(step)

    def samples(self, step: int, samples: list[Mapping[str, Any]]) -> None:
        """Record an evaluation's examples (a rollout's prompts, completions and rewards) at ``step``:
        a JSON line each in ``samples.jsonl``, and a W&B table (``samples``)."""
        if not self._open or not samples:
            return
        with open(self._run_dir / SAMPLES, "a", encoding="utf-8") as file:
            file.writelines(json.dumps({"step": int(step), **sample}) + "\n" for sample in samples)
        columns = list(samples[0])

        def table(run) -> None:
            import wandb

            rows = [[json.dumps(v) if isinstance(v, list) else v for v in sample.values()] for sample in samples]
            run.log({"samples": wandb.Table(columns=["step", *columns], data=[[int(step), *row] for row in rows])},
                    step=int(step))

        self._wandb(table)

    def summary(self, **values: Any) -> None:
        """Set W&B run-summary entries."""
        if not self._open:
            return
        values = scrub(values, self._hidden)
        self._wandb(lambda run: run.summary.update(values))

    def message(self, text: str) -> None:
        """Print a line to the console without breaking the progress bar."""
        if self._open:
            self._progress.print(text)

    def close(self, *, failed: bool = False) -> None:
        """Stop the bar, finish the W&B run (marked failed if ``failed``) and close the
        metrics file. Closing twice is harmless."""
        if not self._open:
            return
        self._open = False
        self._progress.close()
        self._wandb(lambda run: _finish_wandb(run, exit_code=1 if failed else 0))
        if self._tensorboard is not None:
            self._tensorboard.close(failed=failed)
        self._file.close()

    def _wandb(self, call: Callable[[Any], None]) -> None:
        """``call(run)`` on the W&B run, if any; if W&B's service has gone (signalled with the
        job), say so once and go on without W&B."""
        if self._run is None:
            return
        try:
            call(self._run)
        except service_gone() as exc:
            self._run = None
            _abandon_wandb()
            self._progress.print(f"theseus: W&B's service has stopped ({error_line(exc)}), signalled with the job: "
                                 f"the run goes on without W&B; {self._run_dir / 'wandb'} keeps what it had written")

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._open and isinstance(exc, Exception):  # not Ctrl-C or a stop: those are resumable
            record_failure(self._run_dir, exc)
        self.close(failed=exc_type is not None)


# The W&B section of each metric the trainer logs (metrics.jsonl keeps the names on the left);
# a name not listed goes to train/.
SECTIONS = {
    "loss": "train/loss", "val_loss": "val/loss", "val_bpb": "val/bpb",
    "lr": "optim/lr", "grad_norm": "optim/grad_norm",
    "step_time": "throughput/step_time", "tokens_per_s": "throughput/tokens_per_s",
    "flops_per_s": "throughput/flops_per_s", "mfu": "throughput/mfu", "data_wait": "throughput/data_wait",
}


def section(name: str) -> str:
    """The W&B name of metric ``name``: ``loss`` -> ``train/loss``, ``mfu`` -> ``throughput/mfu``."""
    return SECTIONS.get(name, name if "/" in name else f"train/{name}")


def identity(run_dir: Path, sweep_dir: str | None) -> dict[str, Any]:
    """The W&B run's identity: ``id`` (kept in the run directory: a resume continues it),
    ``group`` (the sweep's folder, for a sweep's jobs) and ``job_type`` (``sweep`` or ``train``)."""
    path = run_dir / WANDB_ID
    if path.is_file():
        run_id = path.read_text(encoding="utf-8").strip()
    else:
        run_id = uuid.uuid4().hex[:12]  # W&B ids: letters and digits
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(run_id + "\n", encoding="utf-8")
    group = {"group": sweep_dir[-128:], "job_type": "sweep"} if sweep_dir else {"job_type": "train"}
    return {"id": run_id, "resume": "allow", **group}


def _sweep_dir() -> str | None:
    """The sweep folder when this process runs a job of a Hydra multirun, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return str(HydraConfig.get().sweep.dir)


def git_commit(cwd: Path | None = None) -> str | None:
    """The commit checked out in ``cwd`` (the working directory), or None outside a repository."""
    try:
        proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _start_wandb(mode: str, run_dir: Path, naming: Mapping[str, Any], resolved_config: Mapping[str, Any]):
    import wandb  # here, not at the top: importing it costs a third of a second (W&B off: no cost)

    # W&B's own git probe is off (it writes a diff of uncommitted changes); the commit is given
    settings = wandb.Settings(
        console="off", save_code=False, disable_git=True, silent=True, git_commit=git_commit(),
        x_disable_stats=True, x_disable_machine_info=True, x_save_requirements=False,
    )
    return wandb.init(
        mode=mode, dir=str(run_dir), **naming, config=dict(resolved_config), settings=settings,
    )


def service_gone() -> tuple[type[BaseException], ...]:
    """The errors W&B raises once its service process has ended (W&B imported: it is on)."""
    from wandb.sdk.mailbox.mailbox import MailboxClosedError
    from wandb.sdk.mailbox.mailbox_handle import HandleAbandonedError

    return OSError, MailboxClosedError, HandleAbandonedError


def _abandon_wandb() -> None:
    """Drop the connection to W&B's dead service, and with it W&B's exit hook (which would
    print the same error again as the process exits)."""
    import wandb

    with contextlib.suppress(*service_gone()):
        wandb.teardown()


def _finish_wandb(run, exit_code: int) -> None:
    """Finish ``run`` and wait until W&B's service has written all of it: ``finish()`` alone
    returns before an offline run's log is flushed to disk."""
    import wandb

    run.finish(exit_code=exit_code)
    wandb.teardown(exit_code=exit_code)


def _truncate(path: Path, last_step: int) -> None:
    """Keep the lines of ``path`` up to ``last_step`` (and drop a line cut short by a crash)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if line.endswith("\n") and json.loads(line)["step"] <= last_step]
    if len(kept) < len(lines):
        path.write_text("".join(kept), encoding="utf-8")


def sync_command(run_dir: Path) -> str | None:
    """The command that uploads every W&B segment of the run (None: it has none)."""
    if not any((Path(run_dir) / "wandb").glob("offline-run-*")):
        return None
    return f"wandb sync {Path(run_dir) / 'wandb'}/offline-run-*"
