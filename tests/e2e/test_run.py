"""``python -m theseus.run`` as a user meets it: help, experiments, dry runs, sweeps, reports, sampling."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from support import ROOT, run_python

from theseus.base.processor import processor, running

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

EXPERIMENTS = sorted(p.stem for p in (ROOT / "experiments").glob("*.yaml"))
METRICS = ("loss", "lr", "grad_norm", "step_time", "tokens_per_s", "flops_per_s", "mfu", "data_wait")
HOST = processor()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text((ROOT / "theseus" / "training" / "trainer.py").read_text() * 4)
    return path


def small_data(corpus: Path) -> list[str]:
    return ["data.source=text", f"data.path={corpus}", f"data.cache_dir={corpus.parent / 'cache'}",
            "data.tokenizer=byte", "data.val_fraction=0.1"]


def test_help_lists_groups_experiments_and_keys():
    proc = run_python("-m", "theseus.run", "--help")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"architecture\.n_layers\s+int\s+12\s+\[GPT\] transformer blocks", proc.stdout)
    assert "+experiment: " in proc.stdout and "gpt_small" in proc.stdout and "optimizer.lr" in proc.stdout


def test_unknown_experiment_lists_the_available_ones(tmp_path):
    proc = run_python("-m", "theseus.run", "+experiment=gpt_tinyy", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("theseus: error: unknown experiment 'gpt_tinyy'; available: "
                                   f"{', '.join(EXPERIMENTS)} (files in experiments/)")
    assert not (tmp_path / "run").exists()


def test_cfg_job_prints_the_composed_config():
    proc = run_python("-m", "theseus.run", "+experiment=llama_small", "optimizer.lr=5e-4", "--cfg", "job")
    assert proc.returncode == 0, proc.stderr
    assert "norm: rmsnorm" in proc.stdout and "lr: 0.0005" in proc.stdout and "n_kv_heads: 2" in proc.stdout
    printed = OmegaConf.create(proc.stdout)
    assert printed.architecture.vocab_size == 384  # the byte tokenizer's 257, padded: what the run builds


@pytest.mark.parametrize("flag_first", [False, True])
def test_cfg_job_shows_the_architecture_init_from_derives(flag_first, tmp_path):
    """``--cfg job`` beside ``trainer.init_from=FOLDER``, either side: the folder's 2-layer Llama
    that will train (and its vocabulary), not the default GPT; ``--package`` selects a part of it."""
    from interop.hf_models import llama_config, save_hf, transformers

    save_hf(transformers.LlamaForCausalLM(llama_config()), tmp_path / "llama")
    cfg, given = ["--cfg", "job"], ["trainer.init_from=llama", "optimizer.lr=1e-4"]
    proc = run_python("-m", "theseus.run", *(cfg + given if flag_first else given + cfg), cwd=tmp_path)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr[-3000:]
    printed = OmegaConf.create(proc.stdout)
    assert printed.choices.model == "gpt" and printed.optimizer.lr == 1e-4
    assert {key: printed.architecture[key] for key in ("n_layers", "d_model", "n_kv_heads", "d_ff", "norm",
                                                        "activation", "positions", "vocab_size", "rope_theta")} == {
        "n_layers": 2, "d_model": 64, "n_kv_heads": 2, "d_ff": 96, "norm": "rmsnorm", "activation": "swiglu",
        "positions": "rope", "vocab_size": 333, "rope_theta": 500000.0}
    assert printed.data.tokenizer == str((tmp_path / "llama" / "tokenizer.json").resolve())
    proc = run_python("-m", "theseus.run", *given, "--cfg", "job", "--package", "architecture", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("# @package architecture\n"), proc.stderr[-3000:]
    assert OmegaConf.create(proc.stdout).n_layers == 2
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("experiment", [e for e in EXPERIMENTS if e != "pmm_regression"])
def test_dry_run_of_each_experiment_prints_memory_and_writes_nothing(experiment, corpus, tmp_path):
    run_dir = tmp_path / "run"
    own_data = experiment in ("sft_tiny", "dpo_tiny", "grpo_tiny")  # conversations, pairs, prompts: their own
    data = [] if own_data else small_data(corpus)
    batch = 8 if experiment == "grpo_tiny" else 2  # GRPO's: a group of completions of one prompt
    if experiment == "grpo_tiny":  # its prompts and reward beside the command, as the README makes them
        (tmp_path / "reverse_prompts.jsonl").write_text("".join(
            json.dumps({"prompt": [{"role": "user", "content": f"reverse {w}"}], "answer": w[::-1]}) + "\n"
            for w in ("abcd", "bcde", "cdef", "defg")))
        (tmp_path / "rewards.py").write_text("def correct(completions, answer, **kwargs):\n"
                                             "    return [1.0] * len(completions)\n")
    proc = run_python("-m", "theseus.run", f"+experiment={experiment}", *data,
                      f"trainer.batch_size={batch}", "trainer.grad_accum=1", "trainer.dry_run=true",
                      f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "theseus dry run" in proc.stderr and "XLA temp / device" in proc.stderr
    assert "step time at 100% MFU" in proc.stderr
    assert not run_dir.exists()


def test_pmm_regression_reports_both_test_errors(tmp_path):
    proc = run_python("-m", "theseus.run", "+experiment=pmm_regression", "fit.epochs=20", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) == {"pmm_test_mse", "mlp_test_mse"} and all(0 < v < 1e5 for v in results.values())


@pytest.fixture(scope="module")
def swept(corpus, tmp_path_factory):
    """A two-point sweep of gpt_tiny, logged to offline W&B: its folder and its process (output piped)."""
    sweep_dir = tmp_path_factory.mktemp("sweep")
    proc = run_python("-m", "theseus.run", "-m", "+experiment=gpt_tiny", *small_data(corpus),
                      "optimizer.lr=1e-3,3e-3", "trainer.max_steps=20", "trainer.eval_every=10",
                      "trainer.eval_batches=2", "trainer.log_every=5", f"hydra.sweep.dir={sweep_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir, proc


@pytest.fixture(scope="module")
def sweep(swept) -> Path:
    return swept[0]


def test_sweep_runs_each_point_and_summarises(sweep):
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert sorted(float(row["optimizer.lr"]) for row in rows) == [1e-3, 3e-3]
    assert all(row["status"] == "ok" and float(row["val_loss"]) < 5.6 for row in rows)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]


def test_a_sweep_off_a_terminal_shows_a_line_per_job_and_its_summary(swept):
    """Piped, each job's banner, progress, tables and next commands go to its run.log alone; the
    console has the sweep's first line (where its jobs go; not Hydra's launch lines), one line per
    job (its overrides and how it ended), the summary."""
    sweep, proc = swept
    shown = (proc.stdout + proc.stderr).splitlines()
    assert f"sweep into {sweep}: a line per job as it ends, each job's whole console in its run.log" in shown
    assert not any("Launching" in line for line in shown), shown
    jobs = [line for line in shown if line.startswith("#")]
    assert len(jobs) == 2 and "theseus run" not in proc.stderr and "next:" not in proc.stderr, shown
    for job, (lr, row) in enumerate(zip(("0.001", "0.003"), csv.DictReader((sweep / "summary.csv").open()))):
        assert jobs[job].startswith(f"#{job} +experiment=gpt_tiny ")
        assert f" optimizer.lr={lr} " in jobs[job] and jobs[job].endswith(f", {sweep / str(job)})")
        assert f": step 20/20, val_loss {float(row['val_loss']):.4f}, " in jobs[job]
        log = (sweep / str(job) / "run.log").read_text()
        assert "theseus: compiling" in log and "step 15/20 " in log and "next:" in log
        if HOST is not None and HOST.peak("float32"):  # the start table says which clock the CPU's peak takes
            assert f" GHz ({running(HOST).clock}) x " in log, log
    assert any(line.startswith("sweep: 2 jobs, 0 failed") for line in shown)
    assert len(shown) < 20, shown  # the sweep's line, the jobs', the summary table and its files


def test_each_run_logs_every_metric_and_an_offline_wandb_run(sweep):
    run_dir = sweep / "0"
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [line for line in lines if "loss" in line]
    assert [line["step"] for line in train] == [5, 10, 15, 20]
    assert all(set(METRICS) <= set(line) and all(math.isfinite(line[k]) for k in METRICS) for line in train)
    assert all(0 < line["mfu"] < 1 for line in train)
    assert [line["step"] for line in lines if "val_loss" in line] == [10, 20]
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert b"optimizer" in next(runs[0].glob("*.wandb")).read_bytes()  # the resolved config is in the run


def test_report_renders_a_run_and_the_sweep(sweep):
    for path, count in ((sweep / "0", 1), (sweep, 2)):
        proc = run_python("-m", "theseus.report", str(path))
        assert proc.returncode == 0, proc.stderr[-2000:]
        html = (path / "report.html").read_text()
        data = json.loads(re.search(r"window\.THESEUS = \{data: (.*), live: false\};</script>", html).group(1))
        assert [run["status"] for run in data["runs"]] == ["finished"] * count
        assert all(run["step"] == run["max_steps"] == 20 for run in data["runs"])
        assert [step for step, *_ in data["runs"][0]["series"]["loss"]] == [5, 10, 15, 20]
        assert {"loss", "val_loss", "mfu", "tokens_per_s"} <= {chart["key"] for chart in data["charts"]}


def test_sample_continues_a_prompt(sweep):
    proc = run_python("-m", "theseus.sample", str(sweep / "1"), "--prompt", "def ", "--max-new-tokens", "20",
                      "--temperature", "0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("def ") and len(proc.stdout) > len("def ")


# lr 1e30: step 1's update overflows the parameters, step 3's loss is NaN
DIVERGING = ["+experiment=gpt_tiny", "trainer.max_steps=8", "trainer.log_every=2", "trainer.checkpoint_every=2",
             "trainer.eval_every=0", "logger.mode=disabled"]
DIVERGED = ("TrainingError: the loss or gradients became NaN/Inf at step 3; stopped "
            "(the last good checkpoint is step 2)")


def test_a_diverging_sweep_job_fails_in_one_line_and_keeps_its_last_good_checkpoint(corpus, tmp_path):
    proc = run_python("-m", "theseus.run", "-m", *DIVERGING, *small_data(corpus), "optimizer.lr=1e-3,1e30",
                      f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and DIVERGED in proc.stderr
    assert re.search(rf"^#1 .*optimizer.lr=1e\+?30: failed: {re.escape(DIVERGED)}", proc.stderr, re.M), proc.stderr
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [row["status"] for row in rows] == ["ok", "failed"] and rows[1]["error"].startswith(DIVERGED)
    assert [p.name for p in (tmp_path / "1" / "checkpoints").iterdir()] == ["2"]
    assert sorted(p.name for p in (tmp_path / "0" / "checkpoints").iterdir()) == ["4", "6", "8"]


def test_skip_nonfinite_skips_and_counts_the_updates_and_finishes(corpus, tmp_path):
    proc = run_python("-m", "theseus.run", *DIVERGING, *small_data(corpus), "optimizer.lr=1e30",
                      "trainer.skip_nonfinite=true", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    skipped = [line["nonfinite_skipped"] for line in lines if "nonfinite_skipped" in line]
    assert skipped[0] == 0 and skipped[-1] > 0 and skipped == sorted(skipped)
    assert (tmp_path / "checkpoints" / "8").is_dir()


COUNT_COMPOSITIONS = """
import atexit, sys
from hydra._internal.hydra import Hydra
from hydra.experimental.callback import Callback
from theseus.cli.run import main

class Probe(Callback):  # a callback of the user's: each hook it sees, in order
    def __getattribute__(self, name):
        if name.startswith("on_"):
            print("hook:", name)
        return super().__getattribute__(name)
composed = []  # compositions of the whole command line (one before it of the group choices alone)
original = Hydra.compose_config
Hydra.compose_config = lambda self, *a, **k: (
    composed.append(1) if "trainer.max_steps=2" in k["overrides"] else None) or original(self, *a, **k)
atexit.register(lambda: print(f"compositions: {len(composed)}"))
main(sys.argv[1:])
"""


def test_a_single_run_is_composed_once_and_writes_what_hydra_writes(corpus, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_python("-c", COUNT_COMPOSITIONS, "+experiment=gpt_tiny", *small_data(corpus), "trainer.max_steps=2",
                      "trainer.batch_size=2", "logger.mode=disabled", f"hydra.run.dir={run_dir}",
                      "+hydra.callbacks.probe._target_=__main__.Probe")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "compositions: 1" in proc.stdout
    hooks = [line.removeprefix("hook: ") for line in proc.stdout.splitlines() if line.startswith("hook: ")]
    assert hooks == ["on_run_start", "on_job_start", "on_job_end", "on_run_end"]
    hydra = run_dir / ".hydra"
    assert sorted(p.name for p in hydra.iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert "max_steps=2" in (hydra / "overrides.yaml").read_text() and "max_steps: 2" in (hydra / "config.yaml").read_text()
    assert "mode: RUN" in (hydra / "hydra.yaml").read_text() and (run_dir / "run.log").is_file()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) >= 2


IMPORTED = """
import atexit, runpy, sys
import theseus  # first: the command's process ends after the exit handlers registered from now on
atexit.register(lambda: print("imported:", *sorted(m for m in sys.modules if m.startswith(("theseus.stateful",
                                                                                            "theseus.tasks.regression")))))
sys.argv = ["theseus.run", *sys.argv[1:]]
runpy.run_module("theseus.run", run_name="__main__")
"""


def test_a_gpt_run_imports_no_stateful_module_and_continues_a_run_saved_in_the_older_form(corpus, tmp_path):
    """The options a run does not choose (task=regression and the stateful API under it) are
    never imported; a run directory whose config names its choices the older way (model, task
    and optimizer.name keys) is continued as if it had the record."""
    run_dir = tmp_path / "run"
    tiny = ["+experiment=gpt_tiny", *small_data(corpus), "trainer.batch_size=2", "optimizer=sgd",
            "optimizer.schedule=constant", "optimizer.warmup_steps=0", "trainer.checkpoint_every=2", "trainer.eval_every=0",
            "logger.mode=disabled", f"hydra.run.dir={run_dir}"]
    proc = run_python("-c", IMPORTED, *tiny, "trainer.max_steps=2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "imported:"
    saved = run_dir / ".hydra" / "config.yaml"
    older = OmegaConf.load(saved)
    with open_dict(older):
        del older["choices"]
        older.model, older.task, older.optimizer.name = "gpt", "lm", "sgd"
    OmegaConf.save(older, saved)
    proc = run_python("-c", IMPORTED, *tiny, "trainer.max_steps=4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "imported:" and "resum" in proc.stderr.lower()
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 4


def programs_read_back(first, again) -> list[str]:
    """The programs the ``first`` of two runs of a command compiled, checking that the run ``again``
    read every one of them back from the compilation cache (JAX_LOG_COMPILES's log)."""
    logs = [proc.stdout + proc.stderr for proc in (first, again)]  # JAX's log: stderr, then Hydra's console
    compiled = re.findall(r"Finished XLA compilation of (\S+)", logs[0])
    read_back = re.findall(r"Persistent compilation cache hit for '(\S+)'", logs[1])
    assert len(read_back) == len(re.findall(r"Finished XLA compilation of ", logs[1])) == len(compiled), read_back
    return compiled


def test_the_same_command_again_compiles_nothing_and_a_save_compiles_no_slices(corpus, tmp_path):
    """Every program a command compiles is kept in the compilation cache, its small ones too (the
    init, the evaluation, the loss's mean), so the same command again reads each one back, a
    training run's as an evaluation's; and saving a checkpoint in one process compiles nothing per
    array (orbax's replica-parallel save slices every replicated array, a program per shape and
    replica)."""
    env = {"JAX_LOG_COMPILES": "1", "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax")}
    args = ["-m", "theseus.run", "+experiment=gpt_tiny", *small_data(corpus), "trainer.max_steps=4",
            "trainer.checkpoint_every=2", "trainer.eval_every=2", "logger.mode=disabled"]
    first, again = (run_python(*args, f"hydra.run.dir={name}", devices=2, env=env, cwd=tmp_path)
                    for name in ("first", "again"))
    assert first.returncode == 0 and again.returncode == 0, first.stderr[-3000:] + again.stderr[-3000:]
    compiled = programs_read_back(first, again)
    assert {"jit(train_step)", "jit(eval_step)"} <= set(compiled) and "jit(slice)" not in compiled, compiled
    # theseus.evaluate keeps its programs too (in a cache of its own: the run's hold the same ones)
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "jax-evaluate")
    evaluations = [run_python("-m", "theseus.evaluate", "first", "--out", f"{n}.json", devices=2, env=env,
                              cwd=tmp_path) for n in (1, 2)]
    assert all(proc.returncode == 0 for proc in evaluations), evaluations[0].stderr[-3000:]
    assert "jit(eval_step)" in programs_read_back(*evaluations)
