"""The command-line overrides that compose a given config: what a run started from Python
(``theseus.train(cfg, DIR)``) prints as the ``python -m theseus.run`` command that continues it.

A config from ``compose(OVERRIDES)`` left as composed gives back its ``OVERRIDES`` (the user's
own words); any other (changed in Python, or made by hand) gives its options that are not the
primary config's (``model=scaled_gpt``) and every key whose value differs from what those
options alone compose, each written so that Hydra's parser reads back the same value.
"""

from __future__ import annotations

from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from theseus.config import registry
from theseus.config.compose import compose, composed_from
from theseus.config.schema import flatten

_PARSER = OverridesParser.create()


def overrides_for(cfg: DictConfig) -> list[str]:
    """Overrides that compose ``cfg`` again (its ``hydra`` node aside)."""
    known = composed_from(cfg)
    if known is not None:
        return known
    choices = registry.choices_of(cfg)
    primary = registry.choices_of(compose([]))
    options = [f"{group}={name}" for group, name in choices.items() if primary.get(group) != name]
    base = flatten(OmegaConf.to_container(compose(options), resolve=True))
    flat = flatten(_job(cfg))
    return options + [f"{key}={cli_value(value)}" for key, value in flat.items()
                      if key.split(".")[0] != registry.RECORD and (key not in base or base[key] != value)]


def cli_value(value: Any) -> str:
    """``value`` as an override writes it, read back as the same value by Hydra's parser:
    ``true``, ``null``, ``3e-4``, ``[q,v]``, ``{a:1}``, a string quoted where it must be."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(cli_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{cli_value(item)}" for key, item in value.items()) + "}"
    text = str(value)
    if isinstance(value, str) and _parsed(text) != value:
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def _parsed(text: str) -> Any:
    try:
        return _PARSER.parse_override(f"k={text}").value()
    except HydraException:
        return None


def _job(cfg: DictConfig) -> dict[str, Any]:
    """``cfg`` resolved, without its ``hydra`` node."""
    job = cfg.copy()
    if "hydra" in job:
        with open_dict(job):
            del job["hydra"]
    return OmegaConf.to_container(job, resolve=True)
