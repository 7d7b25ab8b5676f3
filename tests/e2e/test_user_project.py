"""A researcher's own project folder, outside the checkout, driving theseus from the command
line as the README's "Your own model" section shows (its example, as written)."""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from pathlib import Path

import pytest

from support import ROOT, run_python

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

MODELS = Path(__file__).parents[1] / "examples" / "mymodels.py"  # the README's example


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("myproj")
    (root / "mymodels.py").write_text(MODELS.read_text())
    (root / "pyproject.toml").write_text('[project]\nname = "myproj"\nversion = "0.1"\n\n'
                                         '[tool.theseus]\nimports = ["mymodels"]\n')
    (root / "corpus.txt").write_text((ROOT / "theseus" / "training" / "trainer.py").read_text() * 4)
    (root / "experiments").mkdir()
    (root / "experiments" / "mine.yaml").write_text(textwrap.dedent("""\
        # @package _global_
        defaults:
          - override /model: scaled_gpt
        architecture:
          ff_scale: 2.0
        """))
    (root / "sweeps").mkdir()
    (root / "sweeps" / "typo.yaml").write_text("# @package _global_\nhydra:\n  sweeper:\n    params:\n"
                                               "      architecture.ff_scael: 0.5,2\n")
    return root


def data(project: Path) -> list[str]:
    return ["data.source=text", "data.path=corpus.txt", "data.tokenizer=byte", "data.val_fraction=0.1",
            f"data.cache_dir={project / 'cache'}", "logger.mode=disabled"]


def theseus(project: Path, *args: str, **kwargs):
    return run_python("-m", "theseus.run", *args, *data(project), cwd=project, **kwargs)


TINY = ["+experiment=gpt_tiny", "trainer.max_steps=4", "trainer.eval_every=4", "trainer.log_every=2"]


@pytest.fixture(scope="module")
def trained(project) -> Path:
    run_dir = project / "outputs" / "run"
    proc = theseus(project, *TINY, "model=scaled_gpt", "architecture.ff_scale=2", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_the_readme_shows_this_example():
    body = MODELS.read_text().split("\n", 1)[1]  # below its first comment line
    assert body in (ROOT / "README.md").read_text()


def test_trains_the_users_model(trained):
    saved = (trained / ".hydra" / "config.yaml").read_text()
    assert "model: scaled_gpt" in saved and "ff_scale: 2" in saved
    rows = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 4 and "val_loss" in rows[-1]


def test_help_lists_the_users_key_with_its_class(project):
    proc = run_python("-m", "theseus.run", "--help", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"model=scaled_gpt  \(mymodels\.ScaledGPT\)", proc.stdout)
    assert re.search(r"architecture\.ff_scale\s+float\s+1\.0\s+\[ScaledMLP\] multiplier on the MLP output", proc.stdout)


def test_misspelt_user_key_is_suggested(project, tmp_path):
    proc = theseus(project, *TINY, "model=scaled_gpt", "architecture.ff_scael=2", f"hydra.run.dir={tmp_path / 'r'}")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("theseus: error: unknown config key 'architecture.ff_scael'; did you mean "
                                   "architecture.ff_scale (float, default 1.0: multiplier on the MLP output)?")
    assert not (tmp_path / "r").exists()


def test_misspelt_key_in_a_sweep_file_is_one_line_and_writes_nothing(project, tmp_path):
    proc = theseus(project, "-m", *TINY, "+sweep=typo", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"theseus: error: in {project / 'sweeps' / 'typo.yaml'}: unknown config key "
                           "'architecture.ff_scael'; did you mean architecture.ff_scale")
    assert not (tmp_path / "sweep").exists()


def test_project_experiment_and_the_dry_run_count_the_models_flops(project, tmp_path):
    """The project's own experiments/ adds to the shipped ones; the dry run reports the user's
    model's FLOPs (model.flops(seq) x batch)."""
    proc = theseus(project, "+experiment=mine", "architecture.n_layers=2", "architecture.d_model=64",
                   "architecture.n_heads=4", "architecture.seq_len=64", "trainer.batch_size=4",
                   "trainer.dry_run=true", f"hydra.run.dir={tmp_path / 'r'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    vocab = 384  # the byte tokenizer's 257 ids, padded to a multiple of 128
    per_block = 6 * 4 * 64 * 64 * 64 + 12 * 64 * 64**2 + 6 * 2 * 64 * 256 * 64  # attention, scores, MLP
    flops = 4 * (2 * per_block + 6 * 64 * vocab * 64)
    assert re.search(rf"FLOPs / step\s+│ {re.escape(f'{flops:.3e}')} analytic", proc.stderr), proc.stderr[-2000:]
    assert not (tmp_path / "r").exists()


def test_joblib_sweep_over_the_users_key(project, tmp_path):
    sweep = tmp_path / "sweep"
    proc = theseus(project, "-m", *TINY, "model=scaled_gpt", "architecture.ff_scale=0.5,2",
                   "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = json.loads((sweep / "summary.json").read_text())["jobs"]
    assert len(jobs) == 2 and all(job["status"] == "ok" for job in jobs)
    losses = [job["val_loss"] for job in jobs]
    assert losses[0] != losses[1]
    shown = proc.stdout + proc.stderr  # off a terminal: a line per job, its steps in its run.log
    for job, scale in enumerate(("0.5", "2")):
        assert re.search(rf"^#{job} .*architecture.ff_scale={scale} .*: step 4/4, val_loss ", shown, re.M), shown[-3000:]
        assert "step 2/4 " in (sweep / str(job) / "run.log").read_text()
    assert "step 2/4 " not in shown and "[job " not in shown, shown[-3000:]
    # a job's printed continue: its single run (its own values, no -m, no launcher), from its own folder
    (more,) = re.findall(r"continue: (.+)", (sweep / "1" / "run.log").read_text())
    expected = shlex.join(["python", "-m", "theseus.run", *TINY[:1], *TINY[2:], "model=scaled_gpt",
                           "architecture.ff_scale=2", *data(project), f"trainer.init_from={sweep / '1'}",
                           f"hydra.run.dir={sweep / '1'}-more"]) + " trainer.max_steps=N"
    assert more == expected
    ran = run_python(*shlex.split(more.replace("=N", "=1"))[1:], cwd=project)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"starting from the weights of {sweep / '1'}" in ran.stderr
    assert "ff_scale: 2" in (Path(f"{sweep / '1'}-more") / ".hydra" / "config.yaml").read_text()


def test_init_from_a_run_of_the_users_model_builds_that_model(project, trained):
    """Without model=: the run's own model (ScaledGPT, its ff_scale), not a plain GPT."""
    proc = theseus(project, *TINY, f"trainer.init_from={trained}", "trainer.dry_run=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"model\s+│ ScaledGPT: ", proc.stderr), proc.stderr[-3000:]


def test_sampling_the_users_model(project, trained):
    proc = run_python("-m", "theseus.sample", str(trained), "--max-new-tokens", "20", "--temperature", "0",
                      "--prompt", "def ", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("def ") and len(proc.stdout) > len("def ")


def test_a_module_that_fails_to_import_is_one_line(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.theseus]\nimports = ["brokenmodels"]\n')
    (tmp_path / "brokenmodels.py").write_text("import not_a_module_anywhere\n")
    proc = run_python("-m", "theseus.run", "+experiment=gpt_tiny", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"theseus: error: cannot import 'brokenmodels', asked for by "
                                   f"{tmp_path.resolve() / 'pyproject.toml'} ([tool.theseus] imports): "
                                   "ModuleNotFoundError: No module named 'not_a_module_anywhere'")
    assert not (tmp_path / "outputs").exists()


def test_theseus_command_and_its_shell_completion(project):
    proc = run_python("-m", "theseus", "config", "model=scaled_gpt", "architecture.ff_scale=3", cwd=project)
    assert proc.returncode == 0 and "ff_scale: 3" in proc.stdout, proc.stderr
    proc = run_python("-m", "theseus", "-sc", "install=bash", cwd=project)
    assert proc.returncode == 0 and "complete -p theseus" in proc.stdout, proc.stderr
    line = "theseus run model=scaled_gpt architecture.ff_s"
    proc = run_python("-m", "theseus", "-sc", "query=bash", cwd=project, env={"COMP_LINE": line})
    assert proc.returncode == 0 and proc.stdout.split() == ["architecture.ff_scale="], proc.stderr


def test_python_api_composes_and_trains(project, tmp_path):
    script = textwrap.dedent(f"""
        import theseus
        cfg = theseus.compose({[*TINY, "model=scaled_gpt", "architecture.ff_scale=2", "data.source=text",
                                "data.path=corpus.txt", "data.tokenizer=byte", "logger.mode=disabled",
                                f"data.cache_dir={project / 'cache'}"]!r})
        model = theseus.build_model(cfg, vocab_size=256)
        assert type(model).__name__ == "ScaledGPT" and model.n_layers == 2
        try:
            theseus.compose(["architecture.ff_scael=2"])
        except theseus.ConfigError as exc:
            assert "did you mean architecture.ff_scale" in str(exc)
        loss = theseus.train(cfg, {str(tmp_path / 'run')!r})
        print("LOSS", loss)
    """)
    proc = run_python("-c", script, cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.split("LOSS")[1]) < 5.6
    assert (tmp_path / "run" / ".hydra" / "config.yaml").is_file()
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    # its printed continue is the theseus.run command of its config (the user's model kept), and runs
    (more,) = re.findall(r"continue: (.+)", proc.stdout + proc.stderr)
    assert "model=scaled_gpt architecture.ff_scale=2" in more and more.endswith(" trainer.max_steps=N"), more
    ran = run_python(*shlex.split(more.replace("=N", "=1"))[1:], cwd=project)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert re.search(r"model\s+│ ScaledGPT: ", ran.stderr) and f"the weights of {tmp_path / 'run'}" in ran.stderr
