"""Multi-host training for real: two local processes under jax.distributed (4 CPU devices each,
gloo collectives) against one process with 8 devices."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import run_python

from theseus.base.distributed import DistributedConfig, join_arguments
from theseus.base.processor import processor
from theseus.cli.launch import free_port, pin_output_dirs
from theseus.config import ConfigError

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

STEPS = 10
RESUME_AT = 5


def arguments(corpus: Path, run_dir: Path, *extra: str, logger: str = "disabled") -> list[str]:
    return ["+experiment=gpt_tiny", "data.source=text", f"data.path={corpus}", f"data.cache_dir={corpus.parent / 'cache'}",
            f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.eval_every=0", "trainer.eval_batches=1",
            f"trainer.checkpoint_every={RESUME_AT}", "trainer.keep_checkpoints=2", f"logger.mode={logger}",
            "architecture.n_heads=8",  # so that mesh.tensor=8 splits the heads
            f"hydra.run.dir={run_dir}", *extra]


def ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory) -> dict:
    """One process with 8 devices; two with 4 each; the two's step-5 checkpoint resumed in one."""
    root = tmp_path_factory.mktemp("runs")
    one, two, resumed = root / "one", root / "two", root / "resumed"
    ok(run_python("-m", "theseus.run", *arguments(corpus, one), devices=8))
    launched = ok(run_python("-m", "theseus.launch", "--processes", "2", "--devices-per-process", "4", "--",
                             *arguments(corpus, two, logger="offline")))
    restarted = ok(run_python("-m", "theseus.run", *arguments(corpus, resumed),
                              f"trainer.resume={two / 'checkpoints' / str(RESUME_AT)}", devices=8))
    return {"one": one, "two": two, "resumed": resumed, "launched": launched, "restarted": restarted}


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss from metrics.jsonl; a step logged twice is an error."""
    steps = [(line["step"], line["loss"]) for line in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if "loss" in line]
    assert len({step for step, _ in steps}) == len(steps), f"a step was logged twice: {steps}"
    return dict(steps)


def test_two_processes_train_as_one(runs):
    one, two = losses(runs["one"]), losses(runs["two"])
    assert list(two) == list(range(1, STEPS + 1))  # process 1 wrote none: each step once
    assert list(two.values()) == pytest.approx(list(one.values()), rel=1e-5)
    assert two[STEPS] < two[1]
    shown = runs["launched"].stdout + runs["launched"].stderr
    assert "[Gloo]" not in shown and f"step {STEPS}/{STEPS}" in shown  # gloo's connection lines dropped


def test_only_process_0_writes_the_record_and_every_process_its_shards(runs):
    two = runs["two"]
    assert sorted(p.name for p in two.iterdir()) == [".hydra", "checkpoints", "metrics.jsonl", "run.log", "wandb"]
    assert len(list((two / "wandb").glob("offline-run-*"))) == 1  # one W&B run, process 0's
    assert "distributed.process_id=0" in (two / ".hydra" / "overrides.yaml").read_text()
    state = two / "checkpoints" / str(STEPS) / "state"
    assert {p.name for p in state.glob("ocdbt.process_*")} == {"ocdbt.process_0", "ocdbt.process_1"}
    assert f"step {STEPS}/{STEPS} loss" in runs["launched"].stderr + runs["launched"].stdout  # process 0's, streamed


def test_the_launchs_printed_continue_is_a_launch_that_runs(runs, corpus):
    """Not process 0's own command (a dead coordinator address, one process of two): the launch
    command, as given, with the new run's place; run, it starts from the launched run's weights."""
    two = runs["two"]
    (more,) = re.findall(r"continue: (.+)", runs["launched"].stdout + runs["launched"].stderr)
    given = [arg for arg in arguments(corpus, two, logger="offline") if not arg.startswith(("trainer.max_steps=",
                                                                                             "hydra.run.dir="))]
    assert more == " ".join(["python -m theseus.launch --processes 2 --devices-per-process 4 --", *given,
                             f"trainer.init_from={two}", f"hydra.run.dir={two}-more", "trainer.max_steps=N"])
    ran = ok(run_python(*more.replace("=N", "=1").split()[1:]))
    assert f"starting from the weights of {two / 'checkpoints' / str(STEPS)}" in ran.stderr + ran.stdout
    assert "complete: step 1/1" in ran.stderr + ran.stdout


def spawn(script: str, jobs: list[tuple[list[str], dict[str, str]]], timeout: int = 120) -> list[str]:
    """Run ``python -c script ARGS`` for each (ARGS, environment) at once; each one's ``RESULT`` line."""
    procs = [subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "JAX_PLATFORMS": "cpu", **env}) for args, env in jobs]
    outputs = [proc.communicate(timeout=timeout) for proc in procs]
    return [next((line for line in out.splitlines() if line.startswith("RESULT")), err[-2000:]) for out, err in outputs]


def test_a_tensor_axis_spanning_the_processes_trains_as_one(runs, corpus, tmp_path):
    """mesh.tensor=8 over 2 processes: both hold every sequence of the batch, so both read the
    whole batch (a 1/2 share each would be half a batch). The same run as one process's data=8."""
    tensor = ["mesh.data=1", "mesh.tensor=8", "trainer.checkpoint_every=0"]
    ok(run_python("-m", "theseus.launch", "--processes", "2", "--devices-per-process", "4", "--",
                  *arguments(corpus, tmp_path / "two", *tensor)))
    one, two = losses(runs["one"]), losses(tmp_path / "two")
    assert list(two) == list(one) and list(two.values()) == pytest.approx(list(one.values()), rel=1e-5)


def test_every_process_measures_its_own_devices(corpus, tmp_path):
    """Process 1 measuring the peak FLOP/s on process 0's device would time nothing; where the
    processor describes itself, each process takes its own cores' vector peak instead."""
    script = ("import sys, jax; from theseus.config.compose import compose; from theseus.base.distributed import "
              "initialize; cfg = compose(sys.argv[1:]); initialize(cfg); from theseus.recipe import assemble, resolve; "
              "peak, source = assemble(resolve(cfg), steps=None).peak; "
              "print('RESULT', jax.process_index(), source.split(':')[0], 1e8 < peak < 1e14)")
    join = [*arguments(corpus, tmp_path), f"distributed.coordinator=127.0.0.1:{free_port()}", "distributed.num_processes=2"]
    jobs = [([*join, f"distributed.process_id={i}"],
             {"XDG_CACHE_HOME": str(tmp_path / f"host{i}"),  # hosts do not share a cache
              "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}) for i in range(2)]
    source = "measured" if processor() is None or processor().peak("float32") is None else "vector peak"
    assert spawn(script, jobs) == [f"RESULT 0 {source} True", f"RESULT 1 {source} True"]


EVALUATE = """
import json, sys
from theseus.base.distributed import initialize
run, coordinator, index, *args = sys.argv[1:]
if coordinator:
    initialize({"distributed": {"coordinator": coordinator, "num_processes": 2, "process_id": int(index)}})
from theseus.cli.evaluate import run_evaluations  # the trainer's evaluations of a checkpoint
from theseus.sources.parse import parse_source
print("RESULT", json.dumps(run_evaluations(parse_source(run, key=None), None, args)))
"""


def test_lm_eval_tasks_in_two_processes_give_every_process_one_processs_numbers(runs, tmp_path):
    """lm-eval's multiple-choice, perplexity and generation tasks (and theseus's own scorer) on the
    same checkpoint: two processes of 2 devices each, each process with its share of every batch,
    get the same records as each other and as one process of 4 devices."""
    pytest.importorskip("lm_eval")
    from evaluation.harness_fixtures import write_tasks

    tasks = write_tasks(tmp_path / "tasks")
    evaluation = ["evaluation.lm_eval=[theseus_mc,theseus_ppl,theseus_gen]", f"evaluation.lm_eval_include={tasks}",
                  f"evaluation.multiple_choice.mc={tasks / 'mc.jsonl'}"]
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    coordinator = f"127.0.0.1:{free_port()}"
    devices = "--xla_force_host_platform_device_count={}".format
    jobs = [([str(runs["one"]), coordinator, str(i), *evaluation], {**env, "XLA_FLAGS": devices(2)}) for i in range(2)]
    jobs.append(([str(runs["one"]), "", "0", *evaluation], {**env, "XLA_FLAGS": devices(4)}))
    lines = spawn(EVALUATE, jobs, timeout=300)
    assert all(line.startswith("RESULT ") for line in lines), lines
    first, second, alone = (json.loads(line.removeprefix("RESULT ")) for line in lines)
    harness = [record.pop("lm_eval") for record in (first, second, alone)]  # lm-eval's own: its times differ
    assert harness[0]["results"] == harness[1]["results"]
    assert first == second  # every process: the same numbers, the same per-example records
    assert first["mesh"] == alone["mesh"] == {"data": 4, "fsdp": 1, "expert": 1, "tensor": 1}
    assert first["metrics"].keys() == alone["metrics"].keys() >= {
        "eval/theseus_mc/acc", "eval/theseus_mc/acc_norm", "eval/theseus_ppl/word_perplexity",
        "eval/theseus_ppl/bits_per_byte", "eval/theseus_gen/exact_match", "eval/mc/acc"}
    assert first["metrics"] == pytest.approx(alone["metrics"], rel=1e-6)  # val_loss: a mean over processes
    # each row is scored on one device, alike in both: every log-likelihood and generated text is the same
    assert first["samples"] == alone["samples"]
    assert {s["task"] for s in alone["samples"]} == {"mc", "theseus_mc", "theseus_ppl", "theseus_gen"}


def test_two_process_checkpoint_resumes_in_one_process(runs):
    assert f"resuming from {runs['two'] / 'checkpoints' / str(RESUME_AT)} at step {RESUME_AT}" in runs["restarted"].stderr
    resumed, one = losses(runs["resumed"]), losses(runs["one"])
    assert list(resumed) == list(range(RESUME_AT + 1, STEPS + 1))
    assert list(resumed.values()) == pytest.approx([one[s] for s in resumed], rel=1e-5)


def test_dead_coordinator_fails_fast_in_one_line(corpus, tmp_path):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    proc = run_python("-m", "theseus.run", *arguments(corpus, tmp_path / "run"), f"distributed.coordinator={address}",
                      "distributed.num_processes=2", "distributed.process_id=1", "distributed.timeout=5")
    assert time.monotonic() - start < 60
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [(
        f"theseus: error: process 1 of 2 (coordinator {address}) could not join the distributed job within 5 s: "
        "check that distributed.coordinator is process 0's reachable HOST:PORT and that every process was started "
        "(or raise distributed.timeout)")]
    assert not (tmp_path / "run").exists()


def test_launcher_exits_with_a_failed_process_code(corpus, tmp_path):
    proc = run_python("-m", "theseus.launch", "--processes", "2", "--",
                      *arguments(corpus, tmp_path / "run", "trainer.max_steps=0"))
    assert proc.returncode == 2
    assert "theseus: error: trainer.max_steps must be positive, got 0" in proc.stderr


def test_launched_processes_share_one_output_folder():
    now = datetime.datetime(2025, 1, 2, 3, 4, 5)
    assert pin_output_dirs(["+experiment=gpt_tiny", "++hydra.run.dir=mine"], now) == [
        "+experiment=gpt_tiny", "++hydra.run.dir=mine"]
    assert pin_output_dirs([], now) == ["hydra.run.dir=outputs/2025-01-02/03-04-05"]
    assert pin_output_dirs(["-m"], now) == ["-m", "hydra.sweep.dir=multirun/2025-01-02/03-04-05"]


def test_a_slurm_job_joins_with_nothing_set():
    """Two tasks of a (simulated) SLURM step find each other from SLURM's variables alone."""
    script = ("import jax; from theseus.base.distributed import initialize; initialize({}); "
              "print('RESULT', jax.process_index(), jax.process_count(), jax.device_count())")
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_NTASKS": "2",
             "JAX_COORDINATOR_PORT": str(free_port()), "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    jobs = [([], {**slurm, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)}) for i in range(2)]
    assert spawn(script, jobs) == ["RESULT 0 2 4", "RESULT 1 2 4"]


@pytest.mark.parametrize(("settings", "detected", "expected"), [
    ({}, None, None),  # nothing set, no cluster: one process
    ({}, 1, None),  # a cluster job of one process: one process, every local device
    ({}, 4, {}),  # a cluster job: JAX detects everything
    ({"process_id": 2}, 4, {"process_id": 2}),
    ({"coordinator": "10.0.0.1:1234", "num_processes": 2, "process_id": 1}, None,
     {"coordinator_address": "10.0.0.1:1234", "num_processes": 2, "process_id": 1}),
    ({"coordinator": "[::1]:1234", "num_processes": 1, "process_id": 0}, None,
     {"coordinator_address": "[::1]:1234", "num_processes": 1, "process_id": 0}),
])
def test_join_arguments(settings, detected, expected):
    assert join_arguments(DistributedConfig(**settings), detected) == expected


@pytest.mark.parametrize(("settings", "message"), [
    ({"coordinator": "10.0.0.1"}, "distributed.coordinator=10.0.0.1 must be HOST:PORT of process 0"),
    ({"coordinator": "host:99999", "num_processes": 2, "process_id": 0}, "distributed.coordinator=host:99999 must be"),
    ({"num_processes": 0}, "distributed.num_processes must be at least 1, got 0"),
    ({"num_processes": 2, "process_id": 2}, "distributed.process_id=2 must be in 0..1 (distributed.num_processes=2)"),
    ({"process_id": -1}, "distributed.process_id=-1 must be 0 or more"),
    ({"timeout": 0}, "distributed.timeout must be a positive number of seconds, got 0"),
    ({"num_processes": 2, "process_id": 1},
     "distributed.coordinator unset and no SLURM, Open MPI or TPU-pod job detected"),
])
def test_wrong_settings_name_the_key(settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        join_arguments(DistributedConfig(**settings), None)
