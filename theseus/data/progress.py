"""Progress of a long data step on stderr: a rich bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)

PLAIN_STEP = 10  # percent between plain lines, at least
PLAIN_SECONDS = 10.0  # seconds between plain lines (and before the first), at least: a second's work says nothing


@contextlib.contextmanager
def progress(description: str, total: int, unit: str = "bytes") -> Iterator[Callable[..., None]]:
    """Yield ``advance(n, n_documents=0)`` for a task over ``total`` bytes (or ``total`` of
    another ``unit``: ``conversations``).

    On a terminal it drives a rich bar (bytes, speed, documents, time left; or ``n/total unit``);
    elsewhere (CI, logs, pipes) it prints ``theseus: DESCRIPTION: 40% (4.8/12.1 MB, 1,234
    documents, 0:00:12 left)`` (``40% (400/1,000 conversations, ...)``) every PLAIN_STEP percent
    and PLAIN_SECONDS, whichever is longer: work of a few seconds prints nothing.
    """
    console = Console(stderr=True)
    in_bytes = unit == "bytes"
    if console.is_terminal:
        columns = ((DownloadColumn(), TransferSpeedColumn(), TextColumn("{task.fields[documents]:,} documents"))
                   if in_bytes else (MofNCompleteColumn(), TextColumn(unit)))
        with Progress(TextColumn("{task.description}"), BarColumn(), *columns, TimeRemainingColumn(),
                      console=console) as bar:
            task = bar.add_task(description, total=total, documents=0)
            documents = 0

            def advance_bar(n: int, n_documents: int = 0) -> None:
                nonlocal documents
                documents += n_documents
                bar.update(task, advance=n, documents=documents)

            yield advance_bar
        return
    done, documents, shown, start = 0, 0, -PLAIN_STEP, time.monotonic()
    said = start  # when the last line was printed (or the work began)

    def advance(n: int, n_documents: int = 0) -> None:
        nonlocal done, documents, shown, said
        done += n
        documents += n_documents
        percent = 100 * done // max(total, 1)
        if percent >= shown + PLAIN_STEP and time.monotonic() - said >= PLAIN_SECONDS:
            shown, said = percent - percent % PLAIN_STEP, time.monotonic()
            left = time.strftime('%H:%M:%S', time.gmtime((time.monotonic() - start) * (total - done) / max(done, 1)))
            amount = (f"{done / 1e6:.1f}/{total / 1e6:.1f} MB, {documents:,} documents" if in_bytes
                      else f"{done:,}/{total:,} {unit}")
            console.print(f"theseus: {description}: {percent}% ({amount}, {left} left)", highlight=False,
                          soft_wrap=True)

    yield advance
