"""A run on a terminal (a pseudo-terminal here): the progress bar moves at every step the device
finishes, not only at logged ones, with its ETA, and stays one live bar (no plain step lines)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a real run in a subprocess

STEPS = 40


def on_a_terminal(args: list[str], cwd) -> tuple[int, str]:
    """``python ARGS`` with stdin, stdout and stderr a pseudo-terminal; its exit code and all it wrote."""
    leader, follower = pty.openpty()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TERM": "xterm-256color", "COLUMNS": "160"}
    env.pop("TTY_INTERACTIVE", None)
    proc = subprocess.Popen([sys.executable, *args], stdin=follower, stdout=follower, stderr=follower, cwd=cwd,
                            env=env, close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the process has exited
                break
            if not chunk:
                break
            chunks.append(chunk)
        elif proc.poll() is not None:
            break
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


def test_the_bar_moves_between_logged_steps(tmp_path):
    code, out = on_a_terminal(["-m", "theseus.run", "+experiment=gpt_tiny", f"trainer.max_steps={STEPS}",
                               f"trainer.log_every={STEPS}", "trainer.eval_every=0", "trainer.checkpoint_every=0",
                               "trainer.batch_size=64", "logger.mode=disabled", "hydra.run.dir=run"], tmp_path)
    assert code == 0, out[-3000:]
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)  # colours and cursor moves
    shown = {int(step) for step in re.findall(rf"step\s+(\d+)/{STEPS}\b", out)}
    between = {step for step in shown if 0 < step < STEPS}  # none of them logged: log_every is the whole run
    assert len(between) >= 3, (sorted(shown), out[-3000:])
    assert re.search(r"eta \d", out), out[-3000:]  # before the first log: the rate of the steps finished
    assert f"step {STEPS}/{STEPS} loss" not in out and f"step {STEPS}/{STEPS} ━" in out  # the bar, not a plain line
