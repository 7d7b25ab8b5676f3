"""Options declared by where their class lives (imported when chosen) and the ``choices``
record that says which option of each group a config chose."""

from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf

from theseus.config import ConfigError, registry
from theseus.config.compose import compose
from theseus.training.resume import unsafe_changes


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A group ``probe`` of two declared options, each in its own module, none imported."""
    for name in ("a", "b"):
        (tmp_path / f"probe_option_{name}.py").write_text(f"class Option{name.upper()}:\n    pass\n")
        registry.declare("probe", name, f"probe_option_{name}:Option{name.upper()}")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    registry._OPTIONS.pop("probe")
    for name in ("a", "b"):
        sys.modules.pop(f"probe_option_{name}", None)


def test_a_declared_option_is_imported_when_chosen_and_not_before(probe):
    assert registry.names("probe") == ("a", "b") and "probe_option_b" not in sys.modules
    cls = registry.chosen_class({"choices": {"probe": "b"}}, "probe")
    assert cls.__name__ == "OptionB" and cls.__module__ == "probe_option_b"
    assert "probe_option_a" not in sys.modules  # the option not chosen stays unimported
    assert registry.name_of("probe", cls) == "b"
    assert list(registry.options("probe")) == ["a", "b"] and "probe_option_a" in sys.modules  # listing imports all
    assert registry.chosen_class({}, "probe").__name__ == "OptionA"  # no record: the group's first


def test_registering_another_class_under_a_declared_name_fails(probe):
    class Impostor:
        pass

    with pytest.raises(ValueError, match="probe=a is already registered to probe_option_a.OptionA"):
        registry.register("probe", "a")(Impostor)


def test_every_group_records_its_choice_in_the_composed_config():
    cfg = compose(["+experiment=moe_small", "optimizer=sgd"])
    assert registry.choices_of(cfg) == {"model": "moe", "task": "lm", "optimizer": "sgd", "data": "default",
                                        "trainer": "default", "mesh": "default", "distributed": "default",
                                        "logger": "wandb", "evaluation": "default"}
    assert OmegaConf.to_container(cfg.choices) == registry.choices_of(cfg)  # the one record, as saved
    assert registry.model_class(cfg).__name__ == "MoEGPT"
    with pytest.raises(ConfigError, match="unknown config key 'choices.model'"):  # a group is chosen as model=NAME
        compose(["+experiment=gpt_tiny", "choices.model=moe"])


def test_an_older_runs_saved_config_reads_into_the_record(tmp_path):
    """Runs saved before the record named their model and task at the top and their optimizer
    as optimizer.name: read, they are the config of the same choices, so a resume sees no change."""
    composed = compose(["+experiment=gpt_tiny", "optimizer=sgd"])
    legacy = OmegaConf.to_container(composed)
    del legacy["choices"]
    legacy.update(model="gpt", task="lm")
    legacy["optimizer"]["name"] = "sgd"
    OmegaConf.save(OmegaConf.create(legacy), tmp_path / "config.yaml")
    saved = registry.read_saved(tmp_path / "config.yaml")
    assert registry.choices_of(saved) == registry.choices_of(composed)
    assert "model" not in saved and "task" not in saved and "name" not in saved.optimizer
    assert unsafe_changes(OmegaConf.to_container(saved), OmegaConf.to_container(composed)) == []
    other = compose(["+experiment=gpt_tiny", "optimizer=lion"])
    assert ("choices.optimizer", "sgd", "lion") in unsafe_changes(OmegaConf.to_container(saved),
                                                                   OmegaConf.to_container(other))
