"""``python -m theseus.launch --processes 2 [--devices-per-process 4] -- ARGS``: a multi-host job on one machine.

Starts N ``python -m theseus.run ARGS`` processes joined by ``jax.distributed`` through a
coordinator on 127.0.0.1 (a free port), as N hosts would be. Process 0's output is streamed;
the others' is kept and shown only should they fail. When one process fails the others are
stopped, and the launcher exits with the first failure's code (0 when all succeed).
``--devices-per-process`` gives each process that many simulated CPU devices.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO

from theseus.config.arguments import POSITIVE_INT, Parser
from theseus.training.commands import LAUNCHED

GRACE = 10.0  # seconds the other processes get to end after one fails, before they are killed
TAIL = 20  # lines of a failed process's output shown


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pin_output_dirs(args: list[str], now: datetime.datetime) -> list[str]:
    """``args`` with Hydra's run folder (a sweep's folder, with ``-m``) fixed at ``now`` where it
    is not given: left to each process, their timestamps could differ by a second, and so their
    folders. The run's printed commands name it, so that they continue this run."""
    stamp = now.strftime("%Y-%m-%d/%H-%M-%S")
    given = {arg.split("=", 1)[0].lstrip("+") for arg in args}
    key, root = ("hydra.sweep.dir", "multirun") if {"-m", "--multirun"} & set(args) else ("hydra.run.dir", "outputs")
    return args if key in given else [*args, f"{key}={root}/{stamp}"]


def process_command(args: list[str], port: int, processes: int, index: int) -> list[str]:
    """The ``theseus.run`` command line of process ``index``; only process 0 records the run's
    ``.hydra/`` (the processes share the run directory, and their overrides differ)."""
    own = [] if index == 0 else ["hydra.output_subdir=null"]
    return [sys.executable, "-m", "theseus.run", *args, *own, f"distributed.coordinator=127.0.0.1:{port}",
            f"distributed.num_processes={processes}", f"distributed.process_id={index}"]


def process_env(devices: int | None, options: list[str]) -> dict[str, str]:
    """The environment of each process: this one's, plus ``devices`` simulated CPU devices, and
    the launch's ``options`` (``--processes 2 ...``), from which a run prints the launch command
    that continues it (``theseus.training.commands``)."""
    env = {**os.environ, LAUNCHED: shlex.join(options)}
    if devices:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
        env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
        env["JAX_PLATFORMS"] = "cpu"
    return env


def launch(args: list[str], processes: int, devices: int | None = None) -> int:
    """Run the job; the exit code of the first process to fail, or 0.

    SIGINT and SIGTERM sent to the launcher are passed on, once, to every process; they run in
    sessions of their own, so that a terminal's Ctrl-C reaches them only this way.
    """
    options = ["--processes", str(processes), *(["--devices-per-process", str(devices)] if devices else [])]
    port, env = free_port(), process_env(devices, options)
    with contextlib.ExitStack() as stack:
        logs: list[IO[bytes] | None] = [None, *(stack.enter_context(tempfile.TemporaryFile()) for _ in range(1, processes))]
        procs = [subprocess.Popen(process_command(args, port, processes, i), env=env, start_new_session=True,
                                  stdout=logs[i], stderr=subprocess.STDOUT if logs[i] else None)
                 for i in range(processes)]

        def forward(signum: int, frame: object) -> None:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            failed = wait_first_failure(procs)
        finally:
            stop(procs)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if failed is None:
            return 0
        refused = procs[0].returncode == procs[failed].returncode == 2  # a mistake: process 0 has said it, as all would
        if logs[failed] is not None and not refused:
            logs[failed].seek(0)
            tail = logs[failed].read().decode(errors="replace").splitlines()[-TAIL:]
            print("\n".join(f"[process {failed}] {line}" for line in tail), file=sys.stderr)
        return procs[failed].returncode or 1


def wait_first_failure(procs: list[subprocess.Popen]) -> int | None:
    """Wait until every process has succeeded (None) or one has failed (its index)."""
    while True:
        codes = [proc.poll() for proc in procs]
        failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        if failed is not None or all(code == 0 for code in codes):
            return failed
        time.sleep(0.1)


def stop(procs: list[subprocess.Popen]) -> None:
    """Give the processes still running ``GRACE`` seconds to end, then kill them.

    After a peer's failure they are usually blocked in a collective that never completes.
    """
    end = time.monotonic() + GRACE
    for proc in procs:
        try:
            proc.wait(timeout=max(end - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="python -m theseus.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=POSITIVE_INT, required=True, help="processes to start (simulated hosts)")
    parser.add_argument("--devices-per-process", type=POSITIVE_INT, default=None,
                        help="simulated CPU devices per process (sets XLA_FLAGS and JAX_PLATFORMS=cpu)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments of python -m theseus.run")
    options = parser.parse_args(argv)
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    sys.exit(launch(pin_output_dirs(args, datetime.datetime.now()), options.processes, options.devices_per_process))
