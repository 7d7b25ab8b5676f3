"""The report in a real browser (headless Chromium through Selenium and Debian's chromedriver):
the rendered page, not its HTML text. Every run's line is drawn, no legend covers a plotting
area, a run in progress shows its status, step of max_steps and ETA, the controls act, and
the served page follows metrics as they are appended and jobs as they appear."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from synthetic_runs import append_steps, write_run, write_sweep

from theseus.report.data import document
from theseus.report.page import render

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="headless Chromium is not installed: as root, "
                       "apt-get update && apt-get install -y chromium chromium-driver (.ci/run does)"),
]
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,1000")


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)  # Debian's driver: nothing downloaded
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


def wait(driver, condition, timeout: float = 20):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: condition(d))


DRAWN = """
// Per chart: its key, the runs (trace names) whose line or marker has pixels, the plotting area.
return [...document.querySelectorAll('.chart')].map((chart) => ({
  key: chart.dataset.key,
  drawn: [...chart.querySelectorAll('.scatterlayer .trace')].filter((t) =>
    [...t.querySelectorAll('path.js-line, path.point')].some((p) => p.getBBox().width + p.getBBox().height > 0))
    .map((t) => t.__data__[0].trace.name),
  area: chart.querySelector('.nsewdrag').getBoundingClientRect().toJSON(),
  legends: chart.querySelectorAll('.legend').length,
  title: chart.querySelector('.gtitle').getBoundingClientRect().toJSON(),
}));
"""


def overlap(a: dict, b: dict) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


def runs_table(driver) -> dict[str, dict[str, str]]:
    rows = driver.execute_script("""return [...document.querySelectorAll('#runs tr.run')].map((tr) => ({
      path: tr.dataset.path, label: tr.querySelector('.label').textContent, status: tr.querySelector('.status').textContent,
      progress: tr.querySelector('.progress').textContent, eta: tr.querySelector('.eta').textContent}));""")
    return {row["path"].rsplit("/", 1)[-1]: row for row in rows}


def test_sweep_page_draws_every_run_and_no_legend_covers_a_chart(tmp_path, browser):
    sweep = write_sweep(tmp_path / "sweep")
    browser.get((render(sweep)).resolve().as_uri())
    wait(browser, lambda d: len(d.find_elements("css selector", ".chart .scatterlayer .trace")) > 0)
    charts = browser.execute_script(DRAWN)
    labels = [f"optimizer.lr={lr}, trainer.seed={seed}" for lr in ("0.001", "0.003", "0.01") for seed in (0, 1)]
    assert [chart["key"] for chart in charts] == ["loss", "val_loss", "tokens_per_s", "mfu", "lr", "grad_norm"]
    for chart in charts:
        assert sorted(chart["drawn"]) == sorted(labels), chart["key"]
        assert chart["legends"] == 0  # which run is which: the runs table, outside every chart
        assert not overlap(chart["title"], chart["area"])
    table = browser.find_element("id", "runs").rect
    table = {"left": table["x"], "top": table["y"], "right": table["x"] + table["width"], "bottom": table["y"] + table["height"]}
    assert not any(overlap(table, chart["area"]) for chart in charts)
    rows = runs_table(browser)
    assert rows["5"]["status"] == "running" and rows["5"]["progress"] == "120 / 200" and rows["5"]["eta"] == "ETA 40s"
    assert rows["0"]["status"] == "finished" and rows["0"]["progress"] == "200 / 200" and rows["0"]["eta"] == ""
    assert browser.find_elements("css selector", "#parallel .parcoords")  # the swept keys' parallel coordinates
    seeds = browser.find_element("id", "seeds").text
    assert "optimizer.lr=0.003 (best)" in seeds and "single seed" in seeds  # lr=0.01 has one finished seed

    # Hovering a point names its run, step and value.
    hover = browser.execute_script("""const el = document.querySelector('.chart[data-key=loss]');
      Plotly.Fx.hover(el, [{curveNumber: 2, pointNumber: 3}]);
      return el.querySelector('.hoverlayer .hovertext').textContent;""")
    first = json.loads((sweep / "2" / "metrics.jsonl").read_text().splitlines()[3])  # job 2 at step 40
    assert first["step"] == 40 and hover == f"{labels[2]}step 40loss {first['loss']:.4g}"

    # Smoothing: TensorBoard's debiased exponential moving average, the raw line kept faint beneath.
    browser.execute_script("const s = document.getElementById('smoothing'); s.value = '0.6'; s.dispatchEvent(new Event('input'));")
    traces = browser.execute_script("return document.querySelector('.chart[data-key=loss]').data"
                                    ".map((t) => [t.name, t.meta, t.y]);")
    raw = [json.loads(line)["loss"] for line in (sweep / "2" / "metrics.jsonl").read_text().splitlines()
           if "loss" in json.loads(line)]
    ema, expected = 0.0, []
    for i, value in enumerate(raw, 1):
        ema = 0.6 * ema + 0.4 * value
        expected.append(ema / (1 - 0.6 ** i))
    smoothed = next(y for name, meta, y in traces if name == labels[2])
    assert smoothed == pytest.approx(expected, rel=1e-12) and [y for _, meta, y in traces if meta == "raw"][2] == raw
    browser.execute_script("const s = document.getElementById('smoothing'); s.value = '0'; s.dispatchEvent(new Event('input'));")

    # Toggling a run takes its line off every chart; the log axis and the x axis switch.
    browser.find_element("css selector", "#runs tr.run[data-path$='/0']").click()
    assert all(labels[0] not in chart["drawn"] and len(chart["drawn"]) == 5 for chart in browser.execute_script(DRAWN))
    browser.find_element("id", "logy").click()
    assert browser.execute_script("return document.querySelector('.chart')._fullLayout.yaxis.type") == "log"
    browser.execute_script("const s = document.getElementById('xaxis'); s.value = 'tokens'; s.dispatchEvent(new Event('change'));")
    x = browser.execute_script("return document.querySelector('.chart').data[0].x.slice(0, 2)")
    assert x == [10 * 16 * 64, 20 * 16 * 64]  # steps x batch_size x seq_len

    # Sorting the runs table by val_loss puts the best run first.
    header = next(th for th in browser.find_elements("css selector", "#runs th") if th.text == "val_loss")
    header.click()
    assert browser.find_element("css selector", "#runs tr.run .label").text == "optimizer.lr=0.003, trainer.seed=0"


@pytest.fixture
def served(tmp_path):
    """``python -m theseus.report SWEEP --serve --port 0`` in a process of its own; yields (sweep, url)."""
    sweep = write_sweep(tmp_path / "sweep")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, "-m", "theseus.report", str(sweep), "--serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    line = proc.stdout.readline()
    assert line.startswith("serving the report on http://127.0.0.1:"), line + proc.stderr.read()
    yield sweep, line.split(" on ", 1)[1].split()[0]
    proc.terminate()
    proc.wait(timeout=30)


def test_served_page_follows_growing_metrics_and_new_jobs(served, browser):
    sweep, url = served
    browser.get(url)
    wait(browser, lambda d: runs_table(d).get("5", {}).get("progress") == "120 / 200")
    points = "return document.querySelector('.chart[data-key=loss]').data.find((t) => t.name.endsWith('trainer.seed=1') && t.name.includes('0.01')).x.length"
    assert browser.execute_script(points) == 12
    append_steps(sweep / "5", 130, 160)
    wait(browser, lambda d: runs_table(d)["5"]["progress"] == "160 / 200")
    assert browser.execute_script(points) == 16
    write_run(sweep / "6", lr=3e-2, seed=0, upto=40, status=None)  # a new job of the sweep starts
    wait(browser, lambda d: "6" in runs_table(d))
    assert runs_table(browser)["6"]["label"] == "optimizer.lr=0.03, trainer.seed=0"
    assert runs_table(browser)["6"]["status"] == "running"


def test_a_grpo_runs_samples_are_shown(tmp_path, browser):
    run = write_run(tmp_path / "grpo")
    shown = [{"step": 200, "prompt": [{"role": "user", "content": "reverse abcd"}], "completion": "dcba", "correct": 1.0}]
    (run / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in shown))
    browser.get(render(run).resolve().as_uri())
    wait(browser, lambda d: d.find_elements("css selector", "table.samples td"))
    label = document([run])["runs"][0]["label"]
    samples = browser.find_element("id", "samples")
    texts = [[cell.text for cell in samples.find_elements("css selector", selector)]
             for selector in ("h3", "table.samples th", "table.samples tbody td")]
    assert texts == [[f"{label}: step 200"], ["prompt", "completion", "correct"], ["reverse abcd", "dcba", "1"]]
