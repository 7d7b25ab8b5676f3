"""The overrides that compose a config again: what theseus.train prints as its command."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from theseus.config.compose import compose
from theseus.config.overrides import cli_value, overrides_for


def resolved(cfg):
    return OmegaConf.to_container(cfg, resolve=True)


def test_a_composed_config_gives_back_its_own_overrides_and_a_changed_one_recomposes():
    words = ["+experiment=gpt_tiny", "optimizer=lion", "optimizer.lr=1e-3"]
    cfg = compose(words)
    assert overrides_for(cfg) == words  # the user's own words, as composed
    cfg.optimizer.lr = 2e-3  # changed in Python: derived from the config itself
    cfg.data.path = "my corpus's/text.txt"
    cfg.logger.tags = ["a b", "c"]
    derived = overrides_for(cfg)
    assert derived[0] == "optimizer=lion" and "optimizer.lr=0.002" in derived
    assert resolved(compose(derived)) == resolved(cfg)


@pytest.mark.parametrize("value", ["a b", "it's", "true", "1", "null", "x/y.txt", "[q]", 1e-05, 3, 0.1, True, None,
                                   ["q", "v"], {"embed": "fsdp"}])
def test_values_read_back_as_themselves(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert OverridesParser.create().parse_override(f"k={cli_value(value)}").value() == value
