"""Console progress: a live rich bar on a terminal, plain lines elsewhere (CI, SLURM logs).

    step 100/1000 loss 2.345 tok/s 12.3k mfu 4.1% eta 1m23s
    eval step 100: val_loss 2.4 val_bpb 3.46 val_loss/code 2.1 eval/arc/acc 0.31

Every line shown (progress, evaluations, tables, messages) is also appended as plain text to
the run's transcript, ``RUN_DIR/run.log``, by the run's ``RunConsole``. Inside ``console_off``
(a sweep's job off a terminal) nothing is shown: the transcript alone gets it all.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from theseus.base.line_prefix import replaced_output
from theseus.tasks.rewards import shown
from theseus.training.metrics import format_duration, format_si

TRANSCRIPT = "run.log"  # in a run directory: what its console showed (Hydra's job log writes there too)

_OFF: contextvars.ContextVar[bool] = contextvars.ContextVar("theseus_console_off", default=False)


@contextlib.contextmanager
def console_off(transcript: Path) -> Iterator[None]:
    """Inside, a run shows nothing on the console: what it would show, and whatever else this
    process writes through Python (``sys.stdout``, ``sys.stderr``), is appended to ``transcript``
    alone; logging's console handlers are muted (Hydra's job log keeps their records in the same
    file). A sweep's job off a terminal: the sweep's own lines stay readable."""
    transcript.parent.mkdir(parents=True, exist_ok=True)
    with open(transcript, "a", buffering=1, encoding="utf-8") as file, open(os.devnull, "w") as muted, \
            replaced_output(lambda stream: file, handlers_to=muted):
        token = _OFF.set(True)
        try:
            yield
        finally:
            _OFF.reset(token)


class RunConsole:
    """What a run shows: lines and tables on stderr, each also appended as plain text to the
    run's transcript (``RUN_DIR/run.log``) while ``transcript(path)`` is open."""

    def __init__(self) -> None:
        self._file: TextIO | None = None

    @contextlib.contextmanager
    def transcript(self, path: Path) -> Iterator[None]:
        """Append every line shown inside to ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as self._file:
            try:
                yield
            finally:
                self._file = None

    def record(self, text: str) -> None:
        """Write ``text`` (one or more lines) to the open transcript, if any."""
        if self._file is not None:
            self._file.write(text.rstrip("\n") + "\n")
            self._file.flush()

    def show(self, text: str) -> None:
        """Print ``text`` to stderr and to the transcript."""
        if not _OFF.get():
            print(text, file=sys.stderr, flush=True)
        self.record(text)

    def show_table(self, title: str, rows: Sequence[tuple[str, str]]) -> None:
        """Print two columns under a title to stderr, and as plain text to the transcript."""
        table = Table(title=title, show_header=False)
        for key, value in rows:
            table.add_row(key, value)
        if not _OFF.get():
            Console(stderr=True).print(table)
        plain = Console(file=io.StringIO(), width=120, color_system=None)
        plain.print(table)
        self.record(plain.file.getvalue())


def console_for(*shown: RenderableType) -> Console:
    """A console on stdout for ``shown`` (tables): the terminal's; off one (a log, a pipe, where
    rich assumes 80 columns, FORCE_COLOR or not), as wide as the widest of them, so that no column
    or name is cut."""
    console = Console()
    if console.file.isatty():
        return console
    unbounded = Console(file=io.StringIO(), width=100_000)
    return Console(width=max(unbounded.measure(item).maximum for item in shown))


def evaluation_line(step: int, metrics: Mapping[str, float]) -> str:
    """``eval step 30: val_loss 2.345 val_bpb 3.38 ...``: every metric of one evaluation."""
    return f"eval step {step}: " + " ".join(f"{key} {value:.4g}" for key, value in metrics.items())


def sample_line(sample: Mapping[str, object]) -> str:
    """``  sample: PROMPT -> COMPLETION  [reward 1]``: one of an evaluation's examples, its texts
    on one line (a conversation as its last message), cut at 100 characters each."""
    texts = [shown(sample[key], 100) for key in ("prompt", "completion")]
    scores = " ".join(f"{key} {value if value is None else f'{value:.4g}'}" for key, value in sample.items()
                      if key not in ("prompt", "completion"))
    return f"  sample: {texts[0]} -> {texts[1]}" + (f"  [{scores}]" if scores else "")


def status(metrics: Mapping[str, float], eta: float | None) -> str:
    """``loss 2.345 tok/s 12.3k mfu 4.1% eta 1m23s``: the fields present, in that order (a
    rollout's ``reward`` after the loss)."""
    parts = [f"{key} {metrics[key]:.4g}" for key in ("loss", "reward", "val_loss") if key in metrics]
    if "tokens_per_s" in metrics:
        parts.append(f"tok/s {format_si(metrics['tokens_per_s'])}")
    if "mfu" in metrics:
        parts.append(f"mfu {100 * metrics['mfu']:.1f}%")
    if eta is not None:
        parts.append(f"eta {format_duration(eta)}")
    return " ".join(parts)


class Progress:
    """Training progress from ``start`` to ``total`` steps.

    The bar is live only when the console writes to an interactive terminal (not merely
    one rich would colour, as with FORCE_COLOR in CI): it moves at every finished step
    (``advance``), its metrics those of the last logged one (``update``); elsewhere a line per
    logged step. The ETA extrapolates the wall-clock rate since the first step shown, which
    leaves the first step's compilation out.
    """

    def __init__(self, total: int, start: int = 0, *, console: Console | None = None,
                 clock: Callable[[], float] = time.monotonic, record: Callable[[str], None] = lambda text: None):
        self.total = total
        self._record = record  # the transcript's
        self._console = console or Console()
        self._clock = clock
        self._first: tuple[int, float] | None = None  # (step, time) of the first step shown
        self._metrics: Mapping[str, float] = {}  # the last logged step's
        self._bar = None
        if not _OFF.get() and self._console.is_interactive and self._console.file.isatty():
            self._bar = RichProgress(
                TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[status]}", markup=False),
                console=self._console,
            )
            self._task = self._bar.add_task("train", total=total, completed=start, status="")
            self._bar.start()

    @property
    def live(self) -> bool:
        """Whether a bar is shown (which ``advance`` moves)."""
        return self._bar is not None

    def _eta(self, step: int) -> float | None:
        now = self._clock()
        if self._first is None:
            self._first = (step, now)
        done, since = step - self._first[0], now - self._first[1]
        return (self.total - step) * since / done if done > 0 else None

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Show logged ``step`` with its metrics: move the bar, or print one line."""
        self._metrics = metrics
        text = status(metrics, self._eta(step))
        line = f"step {step}/{self.total} {text}".rstrip()
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=text)
            self._record(line)
        else:
            self.print(line)

    def advance(self, step: int) -> None:
        """``step`` has finished (one not logged): the bar moves to it, its ETA with it, its
        metrics still the last logged step's. Off a terminal: nothing."""
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=status(self._metrics, self._eta(step)))

    def print(self, text: str) -> None:
        """A line of text, above the bar when there is one (and in the transcript)."""
        if not _OFF.get():
            self._console.print(text, markup=False, highlight=False, soft_wrap=True)
        self._record(text)

    def close(self) -> None:
        """Stop the bar (it stays on screen at its last state)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
