"""``python -m theseus.report``: the report's document (statuses, labels, seed groups against
scipy), the self-contained page, several paths in one report, bad paths, runs as data."""

from __future__ import annotations

import json
import re
import time
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from support import run_python
from synthetic_runs import LRS, SEEDS, age, final_val_loss, write_run, write_sweep

from theseus.report.data import document
from theseus.report.page import ReportError, render
from theseus.report.records import load

DATA = re.compile(r"window\.THESEUS = \{data: (.*), live: (true|false)\};</script>")


def linked(text: str) -> list[str]:
    """What the page's tags load from elsewhere (src, href); script bodies are not markup."""
    found = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend(value for name, value in attrs if name in ("src", "href"))

    Tags().feed(text)
    return found


def page_data(page) -> dict:
    return json.loads(DATA.search(page.read_text()).group(1))


def test_statuses_steps_and_eta(tmp_path):
    sweep = write_sweep(tmp_path / "sweep")
    write_run(tmp_path / "failed", lr=0.1, upto=30, status="failed", error="FloatingPointError: loss is nan")
    write_run(tmp_path / "stopped", upto=60, status=None)
    age(tmp_path / "stopped", 3600)
    runs = {row["path"].rsplit("/", 1)[-1]: row for row in
            document([sweep, tmp_path / "failed", tmp_path / "stopped"])["runs"]}
    assert [runs[str(i)]["status"] for i in range(6)] == ["finished"] * 5 + ["running"]
    assert (runs["5"]["step"], runs["5"]["max_steps"]) == (120, 200)
    assert runs["5"]["eta"] == "40s"  # 80 steps left at 0.5 s each
    assert runs["failed"]["status"] == "failed" and runs["failed"]["error"] == "FloatingPointError: loss is nan"
    assert runs["stopped"]["status"] == "interrupted" and runs["stopped"]["eta"] is None
    assert runs["0"]["eta"] is None


def test_labels_are_what_differs_else_the_name_else_the_path(tmp_path):
    sweep = write_sweep(tmp_path / "sweep")
    data = document([sweep])
    assert data["title"] == f"sweep {tmp_path.name}/sweep"
    assert data["differing"] == ["optimizer.lr", "trainer.seed"]
    assert data["runs"][2]["label"] == "optimizer.lr=0.003, trainer.seed=0"
    assert data["runs"][2]["differs"] == {"optimizer.lr": "0.003", "trainer.seed": "0"}
    one = write_run(tmp_path / "outputs" / "2026-12-02" / "03-48-32")
    assert document([one])["title"] == "2026-12-02/03-48-32"  # not just the time
    named = write_run(tmp_path / "named", name="baseline")
    assert document([named])["title"] == "baseline"


def test_seed_groups_match_scipy(tmp_path):
    """Each learning rate's mean and 95% interval over its seeds, and Welch's p that the best
    (lr=3e-3) is lower, against scipy computed here from the known final values."""
    sweep = write_sweep(tmp_path / "sweep", running=False)
    seeds = document([sweep])["seeds"]
    assert seeds["seeds"] == ["trainer.seed"] and not seeds["single_seed"]
    finals = {lr: [final_val_loss(lr, seed) for seed in SEEDS] for lr in LRS}
    assert [g["label"] for g in seeds["groups"]] == ["optimizer.lr=0.003", "optimizer.lr=0.001", "optimizer.lr=0.01"]
    for group, lr in zip(seeds["groups"], (3e-3, 1e-3, 1e-2)):
        values = finals[lr]
        low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
        assert group["n"] == 2
        assert group["mean"] == pytest.approx(np.mean(values), rel=1e-12)
        assert group["ci"] == pytest.approx((high - low) / 2, rel=1e-9)
        if lr != 3e-3:
            test = stats.ttest_ind(finals[3e-3], values, equal_var=False, alternative="less")
            assert group["p"] == pytest.approx(test.pvalue, rel=1e-9)
            assert group["t"] == pytest.approx(-test.statistic, rel=1e-9)
    assert seeds["groups"][0]["p"] is None  # the best is not tested against itself


def test_a_single_seed_comparison_says_so(tmp_path):
    for i, lr in enumerate(LRS):
        write_run(tmp_path / "sweep" / str(i), lr=lr)
    seeds = document([tmp_path / "sweep"])["seeds"]
    assert seeds["single_seed"] and seeds["seeds"] == []
    assert [g["ci"] for g in seeds["groups"]] == [None, None, None]
    assert seeds["groups"][0]["text"].endswith("(single seed)")


def test_parallel_coordinates_of_swept_keys(tmp_path):
    parallel = document([write_sweep(tmp_path / "sweep")])["parallel"]
    lr, seed, final = parallel["dimensions"]
    assert lr["label"] == "optimizer.lr (log)"  # 1e-3..1e-2 spans 10x
    assert lr["ticktext"] == ["0.001", "0.003", "0.01"] and lr["values"][0] == pytest.approx(-3)
    assert seed["label"] == "trainer.seed" and final["label"] == "val_loss"
    assert len(final["values"]) == 6  # the running job has logged a val_loss too


def test_the_page_is_self_contained(tmp_path):
    sweep = write_sweep(tmp_path / "sweep")
    page = render(sweep)
    assert page == sweep / "report.html"
    text = page.read_text()
    assert linked(text) == []  # plotly.js is inside: the page fetches nothing
    assert "Plotly" in text and len(page_data(page)["runs"]) == 6
    assert DATA.search(text).group(2) == "false"  # a file does not poll


def test_outputs_holds_named_runs_and_hydras_dated_ones(tmp_path):
    """``outputs/``: the runs named by ``hydra.run.dir`` beside those in Hydra's default DATE/TIME folders."""
    write_run(tmp_path / "outputs" / "tiny", lr=2e-3)
    write_run(tmp_path / "outputs" / "2026-12-02" / "10-00-00", lr=5e-4)
    write_run(tmp_path / "outputs" / "2026-12-03" / "09-00-00", lr=1e-2)
    assert [run.path.relative_to(tmp_path / "outputs").as_posix() for run in load(tmp_path / "outputs")] == \
        ["tiny", "2026-12-02/10-00-00", "2026-12-03/09-00-00"]
    assert [run["differs"]["optimizer.lr"] for run in document([tmp_path / "outputs"])["runs"]] == \
        ["0.002", "0.0005", "0.01"]


@pytest.mark.slow
def test_cli_overlays_several_paths(tmp_path):
    write_sweep(tmp_path / "sweep")
    write_run(tmp_path / "outputs" / "tiny", lr=2e-3)
    write_run(tmp_path / "outputs" / "2026-12-02" / "10-00-00", lr=5e-4)
    result = run_python("-m", "theseus.report", "sweep", "outputs", "-o", "both.html", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "both.html"
    data = page_data(tmp_path / "both.html")
    assert data["title"] == "8 runs" and len(data["runs"]) == 8
    assert [run["label"] for run in data["runs"][-2:]] == \
        ["optimizer.lr=0.002, trainer.seed=0", "optimizer.lr=0.0005, trainer.seed=0"]


@pytest.mark.slow
@pytest.mark.parametrize("name, serve", [("missing", False), ("notes.txt", True), (".", False)])
def test_neither_run_nor_sweep_is_one_line_error(tmp_path, name, serve):
    """A missing path, a file, a folder without runs: one line, exit 2, nothing written (served,
    a folder without runs yet, or not made yet, is no error: a sweep just launched fills it)."""
    (tmp_path / "notes.txt").write_text("not a run")
    path = tmp_path / name
    with pytest.raises(ReportError):
        render(path)
    for extra in ([], ["--serve", "--port", "0"]) if serve else ([],):
        result = run_python("-m", "theseus.report", str(path), *extra, timeout=120)
        assert result.returncode == 2
        assert result.stdout == ""
        assert result.stderr.startswith("theseus: error: ") and result.stderr.count("\n") == 1
    assert not (tmp_path / "report.html").exists()


def test_a_served_folder_fills_as_jobs_start(tmp_path):
    """``--serve`` on a sweep folder before its first job: its data grows as runs appear."""
    import threading
    import urllib.request

    from theseus.report.serve import server

    httpd = server([tmp_path])
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = "http://{}:{}/data.json".format(*httpd.server_address[:2])
    try:
        assert json.loads(urllib.request.urlopen(url).read())["runs"] == []
        write_run(tmp_path / "0", upto=50, status=None)
        data = json.loads(urllib.request.urlopen(url).read())
        assert [(run["label"], run["status"], run["step"]) for run in data["runs"]] == [(f"{tmp_path.name}/0", "running", 50)]
        page = urllib.request.urlopen(url.replace("data.json", "")).read().decode()
        assert DATA.search(page).group(2) == "true"  # the served page polls
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.slow
def test_runs_as_data_in_a_notebook(tmp_path):
    """``theseus.runs.load`` as the README shows it, in a fresh process: rows and a DataFrame."""
    write_sweep(tmp_path / "sweep")
    code = """
import theseus.runs
runs = theseus.runs.load("sweep")
rows = runs.metrics()
frame = runs.dataframe()
summary = runs.summary()
print(len(runs), len(rows), frame.shape[0], sorted(set(frame["optimizer.lr"])))
print(rows[0]["run"], rows[0]["step"], rows[0]["loss"])
print([row["status"] for row in summary])
print(frame[frame.run == "optimizer.lr=0.003, trainer.seed=1"]["val_loss"].dropna().iloc[-1])
"""
    result = run_python("-c", code, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    logged = sum(len(run.metrics) for run in load(tmp_path / "sweep"))
    assert lines[0] == f"6 {logged} {logged} [0.001, 0.003, 0.01]"
    first = json.loads((tmp_path / "sweep" / "0" / "metrics.jsonl").read_text().splitlines()[0])
    assert lines[1] == f"optimizer.lr=0.001, trainer.seed=0 10 {first['loss']}"
    assert lines[2] == str(["finished"] * 5 + ["running"])
    assert float(lines[3]) == pytest.approx(final_val_loss(3e-3, 1))


def test_a_run_stopped_long_ago_is_interrupted_not_running(tmp_path):
    run = write_run(tmp_path / "run", upto=100, status=None)
    assert load(run)[0].status() == "running"
    assert load(run)[0].status(now=time.time() + 3600) == "interrupted"


@pytest.mark.parametrize("exc, status", [(FloatingPointError("loss is nan at step 1\n(lr=10)"), "failed"),
                                         (KeyboardInterrupt(), "running")])
def test_a_run_that_raises_is_failed_until_it_runs_again(tmp_path, exc, status):
    """The logger records an error (not Ctrl-C: that run resumes) for the report; a new attempt clears it."""
    from theseus.training.logger import LoggerConfig, RunLogger

    write_run(tmp_path, steps=10, upto=0, status=None)
    config = LoggerConfig(mode="disabled")
    with pytest.raises(type(exc)), RunLogger(config, tmp_path, resolved_config={}, total_steps=10) as logger:
        logger.log(1, {"loss": 2.0})
        raise exc
    row = document([tmp_path])["runs"][0]
    assert row["status"] == status and row["step"] == 1
    assert row["error"] == ("FloatingPointError: loss is nan at step 1" if status == "failed" else "")
    RunLogger(config, tmp_path, resolved_config={}, total_steps=10, start_step=1).close()
    assert document([tmp_path])["runs"][0]["status"] == "running"


def test_logger_settings_are_no_difference(tmp_path):
    """Two runs that differ in optimizer.lr and in where they log: only the lr labels them."""
    write_run(tmp_path / "a", lr=1e-3)
    write_run(tmp_path / "b", lr=3e-3, name="b")
    data = document([tmp_path / "a", tmp_path / "b"])
    assert data["differing"] == ["optimizer.lr"]
    assert [run["label"] for run in data["runs"]] == ["optimizer.lr=0.001", "b"]


def test_a_folder_of_different_experiments_is_labelled_by_the_keys_typed_that_differ(tmp_path):
    """The README's commands in one folder: gpt_tiny and moe_small differ in dozens of config keys,
    but each run is named by the command-line keys that tell it apart (sorted, a long value cut to
    its end), a repeated command by its folder too, and a run that sets none of them by its folder."""
    from omegaconf import OmegaConf

    from theseus.config.compose import compose

    corpus = "/data/on/the/cluster/a/corpus/whose/name/is/long/web.txt"
    commands = {"tiny": ["+experiment=gpt_tiny"], "again": ["+experiment=gpt_tiny"],
                "moe": ["+experiment=moe_small", "trainer.max_steps=20"],
                "text": ["+experiment=gpt_tiny", "optimizer.lr=0.01", "data.source=text", f"data.path={corpus}"],
                "plain": []}
    for name, overrides in commands.items():
        config = OmegaConf.to_container(compose(overrides))
        write_run(tmp_path / "outputs" / name, composed=(overrides, config))
    data = document([tmp_path / "outputs"])
    runs = load(tmp_path / "outputs")
    assert len(runs.differing) > 20  # what a label of config keys would name
    assert data["differing"] == ["data.path", "data.source", "experiment", "optimizer.lr", "trainer.max_steps"]
    assert {run["path"].rsplit("/", 1)[-1]: run["label"] for run in data["runs"]} == {
        "again": "experiment=gpt_tiny (again)", "tiny": "experiment=gpt_tiny (tiny)",
        "moe": "experiment=moe_small, trainer.max_steps=20",
        "text": "data.path=…ter/a/corpus/whose/name/is/long/web.txt, data.source=text, experiment=gpt_tiny, "
                "optimizer.lr=0.01",
        "plain": "plain"}
    text = next(run for run in data["runs"] if run["path"].endswith("text"))
    assert text["differs"] == {"data.path": corpus, "data.source": "text", "experiment": "gpt_tiny",
                               "optimizer.lr": "0.01", "trainer.max_steps": "60"}  # the table: whole values,
    # a key not typed at its config's value (gpt_tiny's 60 steps)


def test_a_single_run_of_a_sweeps_config_joins_its_group(tmp_path):
    """The README's Dashboards commands: a sweep over lr and seeds, and a single run of gpt_tiny
    that types neither (its config's lr 3e-3 and seed 0): in the report its cells hold those
    values, it is one more seed of the lr=3e-3 group, and it is named by its folder."""
    from omegaconf import OmegaConf

    from theseus.config.compose import compose

    for job, (lr, seed) in enumerate((lr, seed) for lr in ("1e-3", "3e-3") for seed in (0, 1)):
        overrides = ["+experiment=gpt_tiny", f"optimizer.lr={lr}", f"trainer.seed={seed}", "trainer.max_steps=200"]
        write_run(tmp_path / "seeds" / str(job), float(lr), seed,
                  composed=(overrides, OmegaConf.to_container(compose(overrides))))
    single = ["+experiment=gpt_tiny", "logger.tensorboard=true", "trainer.max_steps=200"]
    write_run(tmp_path / "outputs" / "tb", 3e-3, 0, composed=(single, OmegaConf.to_container(compose(single))))
    data = document([tmp_path / "seeds", tmp_path / "outputs" / "tb"])
    assert data["differing"] == ["optimizer.lr", "trainer.seed"]
    tb = data["runs"][-1]
    assert tb["differs"] == {"optimizer.lr": "0.003", "trainer.seed": "0"} and tb["label"] == "outputs/tb"
    groups = {group["label"]: group["n"] for group in data["seeds"]["groups"]}
    assert groups == {"optimizer.lr=0.003": 3, "optimizer.lr=0.001": 2}


def test_a_run_reached_twice_counts_once(tmp_path):
    """A sweep given with one of its jobs, through a link, and a copy of a job (its W&B id): each run
    once, so its seed groups keep two seeds each and the same intervals."""
    import shutil

    sweep = write_sweep(tmp_path / "sweep", running=False)
    (sweep / "1" / "wandb").mkdir()
    (sweep / "1" / "wandb" / "run_id").write_text("3kq9x0ab1c2d\n")
    shutil.copytree(sweep / "1", tmp_path / "copy")
    (tmp_path / "link").symlink_to(sweep)
    once = document([sweep])
    twice = document([sweep, sweep / "0", tmp_path / "link", tmp_path / "copy", tmp_path])
    assert [run["path"] for run in twice["runs"]] == [run["path"] for run in once["runs"]]
    assert [(g["label"], g["n"], g["ci"]) for g in twice["seeds"]["groups"]] == \
        [(g["label"], g["n"], g["ci"]) for g in once["seeds"]["groups"]]
    assert len(load(sweep / "0", sweep)) == 6


@pytest.mark.slow
def test_serving_a_sweep_not_made_yet_waits_for_it_and_a_dropped_browser_is_no_error(tmp_path):
    """``--serve`` started before the sweep makes its folder: it serves, says it waits, and shows
    the first job once it starts; a browser that closes mid-answer prints no traceback."""
    import os
    import socket
    import struct
    import subprocess
    import sys
    import urllib.request

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, "-m", "theseus.report", "multirun/lr", "--serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        serving, waiting = proc.stdout.readline(), proc.stdout.readline()
        assert serving.startswith("serving the report on http://127.0.0.1:"), serving + proc.stderr.read()
        assert waiting == "waiting for runs in multirun/lr (not made yet): each shows as it starts\n"
        url = serving.split(" on ", 1)[1].split()[0]
        assert json.loads(urllib.request.urlopen(url + "data.json").read())["runs"] == []
        write_run(tmp_path / "multirun" / "lr" / "0", upto=50, status=None)
        runs = json.loads(urllib.request.urlopen(url + "data.json").read())["runs"]
        assert [(run["status"], run["step"]) for run in runs] == [("running", 50)]
        host, port = url.split("//")[1].rstrip("/").split(":")
        for _ in range(3):  # the page (megabytes) asked for, and the connection reset before it is sent
            client = socket.create_connection((host, int(port)))
            client.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        time.sleep(1)  # each drop is answered in a thread of its own: let them end
        page = urllib.request.urlopen(url).read().decode()  # still serving
        assert DATA.search(page).group(2) == "true"
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert stderr == ""


def test_a_runs_latest_samples_are_in_its_entry(tmp_path):
    """A GRPO run's evaluations showed prompts, completions and rewards (``samples.jsonl``): the
    report holds the latest evaluation's; a run without them has none."""
    run = write_run(tmp_path / "grpo")
    write_run(tmp_path / "lm", lr=3e-3)
    shown = [{"step": step, "prompt": [{"role": "user", "content": f"reverse {word}"}], "completion": word[::-1],
              "correct": 1.0} for step in (50, 200) for word in ("abcd", "efgh")]
    (run / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in shown))
    entries = {Path(entry["path"]).name: entry for entry in document([tmp_path])["runs"]}
    assert entries["grpo"]["samples"] == shown[2:] and entries["lm"]["samples"] == []
