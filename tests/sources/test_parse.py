"""``parse_source``: every place a model is named parses it here, by looking at the filesystem,
into the class of its kind; what names no model is one line saying what is taken."""

from __future__ import annotations

import json

import pytest

from theseus.config import ConfigError
from theseus.sources import GGUFFile, HFFolder, TheseusRun
from theseus.sources.parse import parse_source


@pytest.fixture
def run_dir(tmp_path):
    """A theseus run's layout: its config and two checkpoint steps."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("{}\n")
    for step in (4, 8):
        (run / "checkpoints" / str(step) / "state").mkdir(parents=True)
    return run


def test_each_kind_is_told_apart(tmp_path, run_dir):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert (parse_source(folder).kind, parse_source(folder).path) == ("hf", folder)
    assert (parse_source(gguf).kind, parse_source(gguf).imported) == ("gguf", True)
    for path, step in ((run_dir, None), (run_dir / "checkpoints", None), (run_dir / "checkpoints" / "4", 4)):
        source = parse_source(path)
        assert (source.kind, source.run_dir, source.step, source.imported) == ("run", run_dir, step, False)


def test_each_kind_is_a_class_that_answers_for_itself(tmp_path, run_dir):
    """What the rest asks of a source, each kind's class answers: what it is in words, whether its
    weights come from outside theseus, its frozen base (a run's: the step it names, else its newest)."""
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    sources = [parse_source(path) for path in (folder, gguf, run_dir, run_dir / "checkpoints" / "4")]
    assert [type(source) for source in sources] == [HFFolder, GGUFFile, TheseusRun, TheseusRun]
    steps = run_dir / "checkpoints"
    assert [(source.what, source.imported, source.base_path) for source in sources] == [
        ("a Hugging Face folder", True, folder), ("a GGUF file", True, gguf),
        ("a theseus run", False, steps / "8"), ("a theseus run", False, steps / "4")]
    with pytest.raises(ConfigError, match=r"^--step 4: .*hf is a Hugging Face folder, which holds one set of weights "
                                          r"\(checkpoint steps are a theseus run's\)$"):
        sources[0].trained_params(4, {}, None)
    with pytest.raises(ConfigError, match=r"^trainer.init_optimizer=true: trainer.init_from=.*model.gguf holds weights "
                                          r"alone \(optimizer state and data positions are a theseus checkpoint's\): "
                                          r"drop trainer.init_optimizer$"):
        sources[1].check_asked(init_optimizer=True, init_data=False)
    sources[2].check_asked(init_optimizer=True, init_data=True)  # a run holds both


def test_a_run_directory_named_by_a_number_names_no_step(tmp_path, run_dir):
    """A multirun's run directories are 0, 1, ...: the newest checkpoint, not step 1."""
    numbered = run_dir.rename(tmp_path / "1")
    assert (parse_source(numbered).step, parse_source(numbered / "checkpoints" / "8").step) == (None, 8)


def test_a_relative_path_is_resolved_and_named_as_given(tmp_path, monkeypatch, run_dir):
    monkeypatch.chdir(tmp_path)
    source = parse_source("run/checkpoints/8", key="dpo.reference")
    assert (source.path, source.step, str(source)) == (run_dir / "checkpoints" / "8", 8, "dpo.reference=run/checkpoints/8")


@pytest.mark.parametrize(("make", "message"), [
    (lambda tmp: tmp / "nowhere", "trainer.init_from={} does not exist: give a Hugging Face folder, a theseus run or "
                                  "checkpoint, a .gguf file or a model id in the local Hugging Face cache"),
    (lambda tmp: _file(tmp / "weights.bin"), "trainer.init_from={} is a file, not a model: give a Hugging Face "
                                             "folder, a theseus run or checkpoint, a .gguf file or a model id in "
                                             "the local Hugging Face cache"),
    (lambda tmp: _folder(tmp / "empty"), "trainer.init_from={} holds no model (no config.json, no checkpoints): give "
                                         "a Hugging Face folder, a theseus run or checkpoint, a .gguf file or a model "
                                         "id in the local Hugging Face cache"),
    (lambda tmp: _file(tmp / "ggufs" / "m.gguf").parent, "trainer.init_from={} holds no model (no config.json, no "
                                                         "checkpoints): give a Hugging Face folder, a theseus run or "
                                                         "checkpoint, a .gguf file or a model id in the local Hugging "
                                                         "Face cache (a GGUF file there: trainer.init_from={}/m.gguf)"),
    (lambda tmp: _folder(tmp / "fresh" / ".hydra").parent,
     "trainer.init_from={} holds no checkpoint (checkpoints/ is empty or absent): train it first, or give a run "
     "directory that trainer.checkpoint_every or the end of its run saved"),
    (lambda tmp: _text(tmp / "broken" / ".hydra" / "config.yaml", "trainer: {max_steps: 2\n").parents[1],
     "{}/.hydra/config.yaml is not valid YAML (line 2): expected ',' or '}}', but got '<stream end>'; it is the run's "
     "saved config: repair it, or remove the run"),  # said first (before: that it holds no checkpoint)
])
def test_what_names_no_model_is_one_line(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(ConfigError) as error:
        parse_source(str(path))
    assert str(error.value) == message.format(path, path)


def test_a_missing_step_names_the_saved_ones(run_dir):
    with pytest.raises(ConfigError) as error:
        parse_source(run_dir / "checkpoints" / "3")
    assert str(error.value) == (f"trainer.init_from={run_dir}/checkpoints/3: {run_dir}/checkpoints holds no step 3; "
                                f"its saved steps are 4, 8")


def test_a_command_argument_is_named_alone(tmp_path):
    with pytest.raises(ConfigError, match=rf"^{tmp_path}/nowhere does not exist: give "):
        parse_source(tmp_path / "nowhere", key=None)


def test_a_model_id_is_its_snapshot_in_the_hub_cache(tmp_path, monkeypatch):
    """As huggingface_hub lays the cache out (models--ORG--NAME/refs/main names the snapshot),
    found where HF_HOME puts it, offline."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    repo = tmp_path / "hf" / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    for revision in ("0123abc", "4567def"):
        _file(repo / "snapshots" / revision / "config.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("4567def")
    source = parse_source("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert (source.kind, source.path) == ("hf", repo / "snapshots" / "4567def")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError) as error:
        parse_source("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert str(error.value) == (
        f"trainer.init_from=HuggingFaceTB/SmolLM2-135M-Instruct is no local path, and HuggingFaceTB/SmolLM2-135M-"
        f"Instruct is not in the Hugging Face cache ({tmp_path}/elsewhere): download it where there is a network "
        f"(hf download HuggingFaceTB/SmolLM2-135M-Instruct) or give a Hugging Face folder, a theseus run or "
        f"checkpoint, a .gguf file or a model id in the local Hugging Face cache")


def test_a_missing_folder_under_an_existing_one_is_no_model_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    with pytest.raises(ConfigError, match="^trainer.init_from=outputs/run does not exist"):
        parse_source("outputs/run")


TAKES = ("give a Hugging Face folder, a theseus run or checkpoint, a .gguf file or a model id in the local Hugging "
         "Face cache")


@pytest.mark.parametrize(("given", "where"), [
    ("outputs/tiny", "no folder {cwd}/outputs/tiny, and no model outputs/tiny in the Hugging Face cache at {hub}"),
    ("multirun/3", "no folder {cwd}/multirun/3, and no model multirun/3 in the Hugging Face cache at {hub}"),
    ("tiny/checkpoints", "no folder {cwd}/tiny/checkpoints, and no model tiny/checkpoints in the Hugging Face cache "
                         "at {hub}"),
    ("model.safetensors", "no file {cwd}/model.safetensors"),
    ("org/model.gguf", "no file {cwd}/org/model.gguf"),
    ("./tiny", "no folder {cwd}/tiny"),
    ("runs/tiny/checkpoints/100", "no folder {cwd}/runs/tiny/checkpoints/100"),
])
def test_a_missing_path_is_a_missing_path_not_a_model_to_download(tmp_path, monkeypatch, given, where):
    """A run's path given from another folder is said to be missing there, not sent to ``hf download``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError) as error:
        parse_source(given, key=None)
    assert str(error.value) == f"{given} does not exist ({where.format(cwd=tmp_path, hub=tmp_path / 'hub')}): {TAKES}"


def test_a_cached_model_of_a_paths_form_is_the_model(tmp_path, monkeypatch):
    """Nothing local of that name, the hub cache holding it: the model is meant."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    _file(tmp_path / "hub" / "models--outputs--tiny" / "snapshots" / "0123abc" / "config.json")
    assert parse_source("outputs/tiny").path == tmp_path / "hub" / "models--outputs--tiny" / "snapshots" / "0123abc"


def _file(path):
    return _text(path, "{}")


def _text(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _folder(path):
    path.mkdir(parents=True)
    return path
