"""Progress of a long data step on stderr: a rich bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)

PLAIN_STEP = 10  # percent between plain lines


@contextlib.contextmanager
def progress(description: str, total_bytes: int) -> Iterator[Callable[..., None]]:
    """Yield ``advance(n_bytes, n_documents=0)`` for a task over ``total_bytes`` bytes.

    On a terminal it drives a rich bar (bytes, speed, documents, time left); elsewhere (CI,
    logs, pipes) it prints ``theseus: DESCRIPTION: 40% (4.8/12.1 MB, 1,234 documents, 0:00:12
    left)`` every PLAIN_STEP percent.
    """
    console = Console(stderr=True)
    if console.is_terminal:
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TextColumn("{task.fields[documents]:,} documents"), TimeRemainingColumn())
        with Progress(*columns, console=console) as bar:
            task = bar.add_task(description, total=total_bytes, documents=0)
            documents = 0

            def advance_bar(n: int, n_documents: int = 0) -> None:
                nonlocal documents
                documents += n_documents
                bar.update(task, advance=n, documents=documents)

            yield advance_bar
        return
    done, documents, shown, start = 0, 0, -PLAIN_STEP, time.monotonic()

    def advance(n: int, n_documents: int = 0) -> None:
        nonlocal done, documents, shown
        done += n
        documents += n_documents
        percent = 100 * done // max(total_bytes, 1)
        if percent >= shown + PLAIN_STEP:
            shown = percent - percent % PLAIN_STEP
            left = (time.monotonic() - start) * (total_bytes - done) / max(done, 1)
            console.print(f"theseus: {description}: {percent}% ({done / 1e6:.1f}/{total_bytes / 1e6:.1f} MB, "
                          f"{documents:,} documents, {time.strftime('%H:%M:%S', time.gmtime(left))} left)",
                          highlight=False, soft_wrap=True)

    yield advance
