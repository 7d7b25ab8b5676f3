"""Progress of a long data step on stderr: a rich bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

PLAIN_STEP = 10  # percent between plain lines


@contextlib.contextmanager
def progress(description: str, total_bytes: int) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n_bytes)`` for a task over ``total_bytes`` bytes.

    On a terminal it drives a rich bar; elsewhere (CI, logs, pipes) it prints
    ``theseus: DESCRIPTION: 40% (4.8/12.1 MB)`` every PLAIN_STEP percent.
    """
    console = Console(stderr=True)
    if console.is_terminal:
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console) as bar:
            task = bar.add_task(description, total=total_bytes)
            yield lambda n: bar.advance(task, n)
        return
    done, shown = 0, -PLAIN_STEP

    def advance(n: int) -> None:
        nonlocal done, shown
        done += n
        percent = 100 * done // max(total_bytes, 1)
        if percent >= shown + PLAIN_STEP:
            shown = percent - percent % PLAIN_STEP
            console.print(f"theseus: {description}: {percent}% ({done / 1e6:.1f}/{total_bytes / 1e6:.1f} MB)",
                          highlight=False, soft_wrap=True)

    yield advance
