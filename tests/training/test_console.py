"""Console progress: plain lines off a terminal, a rich bar on one."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from rich.table import Table

from theseus.training.console import Progress, console_for, status


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_when_not_a_terminal(capsys, monkeypatch):
    clock = Clock()
    monkeypatch.setenv("FORCE_COLOR", "1")  # as CI logs often set: colour, but no live bar
    progress = Progress(1000, clock=clock)  # pytest's captured stdout is not a terminal
    progress.update(100, {"loss": 2.3456, "tokens_per_s": 12345.0, "mfu": 0.0412})
    clock.now = 9.0  # 100 steps in 9 s: 800 steps to go take 72 s
    progress.update(200, {"loss": 2.1, "tokens_per_s": 12300.0, "mfu": 0.041, "lr": 1e-3})
    progress.print("[checkpoint] saved")
    progress.close()
    assert capsys.readouterr().out.splitlines() == [
        "step 100/1000 loss 2.346 tok/s 12.3k mfu 4.1%",
        "step 200/1000 loss 2.1 tok/s 12.3k mfu 4.1% eta 1m12s",
        "[checkpoint] saved",
    ]


def test_status_shows_validation_loss():
    assert status({"val_loss": 1.5}, eta=5.0) == "val_loss 1.5 eta 5s"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_rich_bar_on_a_terminal(monkeypatch):
    monkeypatch.delenv("TTY_INTERACTIVE", raising=False)
    out = Terminal()
    progress = Progress(10, start=2, console=Console(file=out, width=120))
    progress.update(5, {"loss": 0.5, "mfu": 0.25})
    progress.print("a message")
    progress.close()
    text = out.getvalue()
    assert "5/10" in text and "loss 0.5" in text and "mfu 25.0%" in text and "a message" in text


def test_the_transcript_keeps_what_the_console_showed(tmp_path, capsys):
    from theseus.training.console import RunConsole, evaluation_line

    log, console, other = tmp_path / "run" / "run.log", RunConsole(), RunConsole()
    console.show("before")  # no transcript open: the console only
    with console.transcript(log):
        console.show("theseus: run directory X")
        other.show("another run's line")  # each run its own transcript
        console.show_table("theseus run", [("model", "GPT: 10 parameters")])
        progress = Progress(4, console=Console(file=io.StringIO(), width=120), record=console.record)
        progress.update(2, {"loss": 2.5})
        progress.print(evaluation_line(2, {"val_loss": 2.25, "val_loss/code": 1.5, "eval/arc/acc": 0.3125}))
    console.show("after")
    text = log.read_text()
    assert text.startswith("theseus: run directory X\n") and "before" not in text and "after" not in text
    assert "another run" not in text and "│ model │ GPT: 10 parameters │" in text
    assert text.endswith("step 2/4 loss 2.5\neval step 2: val_loss 2.25 val_loss/code 1.5 eval/arc/acc 0.3125\n")
    assert "theseus: run directory X" in capsys.readouterr().err


def test_the_bar_moves_at_every_finished_step_between_logged_ones(monkeypatch):
    """On a terminal each finished step moves the bar, with an ETA from the first step shown
    and the last logged metrics; off one, ``advance`` shows nothing (a line per logged step)."""
    monkeypatch.delenv("TTY_INTERACTIVE", raising=False)
    clock, out = Clock(), Terminal()
    progress = Progress(100, console=Console(file=out, width=120), clock=clock)
    assert progress.live
    progress.update(10, {"loss": 2.5})
    for step in range(11, 15):
        clock.now += 2.0
        progress.advance(step)
    [task] = progress._bar.tasks
    assert task.completed == 14 and task.fields["status"] == "loss 2.5 eta 2m52s"  # 4 steps in 8 s: 86 to go
    progress.close()
    assert "14/100" in out.getvalue()

    plain = io.StringIO()
    progress = Progress(100, console=Console(file=plain, width=120), clock=clock)
    assert not progress.live
    progress.advance(3)
    progress.update(10, {"loss": 2.5})
    assert plain.getvalue() == "step 10/100 loss 2.5\n"


def test_with_the_console_off_the_transcript_alone_gets_everything(tmp_path, capfd):
    """A quiet sweep job: its tables, progress and messages, and what else it prints, go to its
    run.log, once each; nothing reaches the console, a logger's console handler included."""
    import logging
    import sys

    from theseus.training.console import RunConsole, console_off

    log, console = tmp_path / "run" / "run.log", RunConsole()
    handler = logging.StreamHandler(sys.stderr)
    logging.root.addHandler(handler)
    try:
        with console_off(log), console.transcript(log):
            print("theseus: compiling GPT's train step")  # printed outside the run's console
            console.show("theseus: run directory X")
            console.show_table("theseus run", [("model", "GPT: 10 parameters")])
            progress = Progress(4, record=console.record)
            progress.update(2, {"loss": 2.5})
            progress.print("eval step 2: val_loss 2.25")
            logging.getLogger("probe").warning("a library's warning")
            progress.close()
    finally:
        logging.root.removeHandler(handler)
    shown = capfd.readouterr()
    assert shown.out == shown.err == ""
    text = log.read_text()
    assert text.startswith("theseus: compiling GPT's train step\ntheseus: run directory X\n")
    assert text.count("│ model │ GPT: 10 parameters │") == 1 and "a library's warning" not in text
    assert text.endswith("step 2/4 loss 2.5\neval step 2: val_loss 2.25\n")
    console.show("after")
    assert "after" in capfd.readouterr().err


@pytest.mark.parametrize("force_color", [None, "1"])
def test_off_a_terminal_a_wide_table_is_printed_whole(force_color, capsys, monkeypatch):
    """A log or a pipe (FORCE_COLOR set or not, as in CI): no column name cut at rich's 80 columns."""
    if force_color:
        monkeypatch.setenv("FORCE_COLOR", force_color)
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    names = ["job", "optimizer.lr", "architecture.n_layers", "trainer.seed", "val_loss", "tokens_per_s", "mfu"]
    table = Table()
    for name in names:
        table.add_column(name)
    table.add_row(*["0.0001"] * len(names))
    console_for(table).print(table)
    header = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out.splitlines()[1])
    assert len(header) > 80 and [name.strip() for name in header.strip("┃ ").split("┃")] == names, header
