"""``python -m theseus.report``: a synthetic run and sweep rendered to one HTML page."""

from __future__ import annotations

import base64
import io
import json
import math
import re
import struct
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from theseus.report import plots
from theseus.report.page import ReportError, render
from theseus.training.runs import RESULT, Run

from support import run_python

PNG = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def write_run(path: Path, lr: float = 1e-3, steps: int = 600, fail_at: int | None = None) -> Path:
    """A run directory as a training job leaves it: config, overrides, metrics."""
    (path / ".hydra").mkdir(parents=True)
    config = {"optimizer": {"lr": lr}, "trainer": {"batch_size": 16, "max_steps": steps}, "architecture": {"seq_len": 256}}
    OmegaConf.save(config, path / ".hydra" / "config.yaml")
    OmegaConf.save(["+experiment=gpt_tiny", f"optimizer.lr={lr}"], path / ".hydra" / "overrides.yaml")
    floor = 1.4 + 2 * (math.log10(lr) + 2.7) ** 2 / 10
    lines = []
    for step in range(10, (fail_at or steps) + 1, 10):
        loss = floor + 4 * math.exp(-step * lr * 8) + 0.03 * math.sin(step)
        lines.append({"step": step, "loss": loss, "lr": lr * min(1, step / 100), "grad_norm": 2 * math.exp(-step / 200) + 0.3,
                      "step_time": 0.05, "tokens_per_s": 80_000 + 500 * math.cos(step), "mfu": 0.31 + 0.01 * math.sin(step),
                      "data_wait": 0.001})
        if step % 100 == 0:
            lines.append({"step": step, "val_loss": loss + 0.05})
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def write_sweep(path: Path, lrs=(3e-4, 1e-3, 3e-3, 1e-2), failing: float = 1e-2) -> Path:
    """A sweep folder: one run per learning rate, the one at ``failing`` diverged."""
    for i, lr in enumerate(lrs):
        job = write_run(path / str(i), lr=lr, fail_at=250 if lr == failing else None)
        result = {"status": "failed", "error": "FloatingPointError: loss is nan at step 250"} if lr == failing else {"status": "ok", "error": ""}
        (job / RESULT).write_text(json.dumps(result))
    return path


def images(page: Path) -> list[bytes]:
    return [base64.b64decode(data) for data in PNG.findall(page.read_text())]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_run_renders_every_chart(tmp_path):
    run = write_run(tmp_path / "run")
    page = render(run)
    assert page == run / "report.html"
    text = page.read_text()
    charts = images(page)
    assert len(charts) == 6  # loss vs steps and tokens, tokens/s, MFU, lr, grad norm
    width, height = png_size(charts[0])
    assert 600 <= width <= 1200 and 300 <= height <= 800
    assert "+experiment=gpt_tiny optimizer.lr=0.001" in text
    assert "<b>2,457,600</b><span>tokens seen</span>" in text  # 600 steps x 16 x 256


def test_a_mixture_run_adds_per_source_and_task_charts(tmp_path):
    run = write_run(tmp_path / "run")
    extra = [{"step": step, "val_loss/stdlib": 2.0 - step / 1000, "val_loss/text": 2.5 - step / 800,
              "eval/toy/acc": step / 600, "eval/toy/acc_norm": step / 700} for step in (100, 300, 600)]
    with (run / "metrics.jsonl").open("a") as f:
        f.write("".join(json.dumps(line) + "\n" for line in extra))
    assert len(images(render(run))) == 8  # and validation loss per source, multiple-choice accuracy
    from theseus.report.plots import family
    from theseus.training.runs import Run

    assert family([("", Run.load(run))], "eval/", "/acc_norm", "acc_norm") is not None
    assert family([("", Run.load(run))], "eval/", "/f1", "f1") is None


def test_sweep_renders_summary_and_final_metric(tmp_path):
    sweep = write_sweep(tmp_path / "sweep")
    page = render(sweep)
    text = page.read_text()
    assert len(images(page)) == 1 + 6  # val_loss against optimizer.lr, then the overlaid runs
    assert all(png_size(image)[0] >= 600 for image in images(page))
    table = text[text.index("<table>"):text.index("</table>")]
    assert table.count("<tr class=ok>") == 3 and table.count("<tr class=failed>") == 1
    assert "FloatingPointError: loss is nan at step 250" in table
    assert "<th>optimizer.lr</th>" in table and "<th>+experiment</th>" not in table


def test_cli_prints_the_page(tmp_path):
    run = write_run(tmp_path / "run", steps=100)
    result = run_python("-m", "theseus.report", str(run), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(run / "report.html")
    assert len(images(run / "report.html")) == 6


@pytest.mark.parametrize("make", [lambda tmp: tmp / "missing", lambda tmp: tmp])
def test_neither_run_nor_sweep_is_one_line_error(tmp_path, make):
    (tmp_path / "notes.txt").write_text("not a run")
    path = make(tmp_path)
    with pytest.raises(ReportError):
        render(path)
    result = run_python("-m", "theseus.report", str(path), timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("theseus: error: ") and result.stderr.count("\n") == 1
    assert not (tmp_path / "report.html").exists()


def blue_pixels(image: bytes) -> int:
    """Pixels of ``image`` (PNG bytes) clearly blue, as C0 (the first run's color) and its blends
    with white are; the axes, grid and text are grey or black."""
    from matplotlib.image import imread

    r, g, b = (imread(io.BytesIO(image))[..., :3] * 255).astype(int).transpose(2, 0, 1)
    return int(((b - r > 60) & (b > g)).sum())


def test_a_series_of_one_point_is_drawn(tmp_path):
    """A sweep of 6-step jobs logs each metric once (log_every > max_steps): markers, not empty charts."""
    run = write_run(tmp_path / "run", steps=10)  # one row per metric, at step 10
    loaded = Run.load(run)
    assert [len(loaded.series(key)[0]) for key in ("loss", "tokens_per_s")] == [1, 1]
    for chart in (plots.metric([("", loaded)], "tokens_per_s", "throughput"), plots.loss([("", loaded)])):
        assert blue_pixels(chart) > 20  # a marker (a lone point without one draws no pixel)
