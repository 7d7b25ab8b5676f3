"""The built wheel, installed (no editable checkout) into a fresh environment, runs a job from
an unrelated folder: conf/, experiments/ and sweeps/ ship inside the package."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from support import ROOT, bare_env, fresh_python

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses


def test_wheel_installs_and_runs_gpt_tiny_from_another_folder(tmp_path):
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(dist), str(ROOT)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next(dist.glob("theseus-*.whl"))
    env_dir = tmp_path / "fresh"
    # theseus's dependencies come from this environment's site-packages (this checkout's editable
    # install among them stays out)
    python = fresh_python(env_dir, Path(sysconfig.get_path("purelib")))
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                              str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "corpus.txt").write_text((ROOT / "README.md").read_text() * 8)
    env = bare_env()
    where = subprocess.run([python, "-c", "import theseus.config.registry as r; print(r.shipped('experiments'))"],
                           capture_output=True, text=True, cwd=work, env=env)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout
    run = subprocess.run([python, "-m", "theseus.run", "+experiment=gpt_tiny", "trainer.max_steps=2",
                          "trainer.eval_every=2", "data.source=text", "data.path=corpus.txt", "logger.mode=disabled",
                          f"data.cache_dir={tmp_path / 'cache'}", "hydra.run.dir=run"],
                         capture_output=True, text=True, cwd=work, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and "val_loss" in rows[-1]
    console = env_dir / "bin" / "theseus"
    listing = subprocess.run([console, "config"], capture_output=True, text=True, cwd=work, env=env)
    assert listing.returncode == 0, listing.stderr
    packaged = ", ".join(sorted(path.stem for path in (ROOT / "experiments").glob("*.yaml")))
    assert f"+experiment: {packaged}  (experiments/)" in listing.stdout, listing.stdout  # the wheel's own
