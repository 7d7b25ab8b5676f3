"""A run's config is resolved once (``theseus.recipe.resolve``) into a ``RunSpec`` and passed down
explicitly: followed from ``theseus.cli.run.execute`` to the compiled step, it visits few files,
rarely climbs back up the layers, and is laid over by its derived values once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

import theseus
from theseus.config import ConfigError, Snapshot
from theseus.config.compose import compose
from test_imports import LAYERS
from theseus.training.spec import RunSpec

PACKAGE = Path(theseus.__file__).parent
FLOORS = {**LAYERS, "recipe.py": LAYERS["recipe"]}  # tests/test_imports.py's floors, by a path's first part


class Compiling(Exception):
    """Raised where the run's step is compiled: the end of the config's path."""


def config_path(cfg: DictConfig, run_dir: Path) -> tuple[list[str], list[str]]:
    """``(visits, calls)``: the theseus files, in order, whose functions the run's config reaches
    from ``execute(cfg, run_dir)`` to ``compile_steps`` (a function given it as an argument: the
    composed config, its resolved values or the spec; or one reading the active configuration,
    ``configure()`` called under one), and the names of the functions called on the way."""
    from theseus.cli.run import execute
    from theseus.config.context import active

    visits, calls = [], []

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(str(PACKAGE)):
            return
        calls.append(code.co_name)
        if code.co_name == "compile_steps":
            visits.append(code.co_filename)
            raise Compiling
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if any(isinstance(frame.f_locals.get(name), DictConfig | Snapshot | RunSpec) for name in names):
            visits.append(code.co_filename)
        elif code.co_name == "configure" and active() is not None:
            visits.append(frame.f_back.f_code.co_filename)

    sys.setprofile(profile)
    try:
        with pytest.raises(Compiling):
            execute(cfg, run_dir)
    finally:
        sys.setprofile(None)
    return [str(Path(path).relative_to(PACKAGE)) for path in visits], calls


def climbs(visits: list[str]) -> int:
    """How often the config goes back up a floor, file to file; a call into ``config/`` (composing,
    reading, configuring: the config's own package) and back is not counted."""
    outside = [path for path in visits if not path.startswith("config/")]
    floors = [FLOORS[path.split("/")[0]] for i, path in enumerate(outside) if i == 0 or path != outside[i - 1]]
    return sum(b > a for a, b in zip(floors, floors[1:]))


@pytest.mark.slow
def test_a_run_s_config_is_resolved_once_and_passed_down(tmp_path):
    cfg = compose(["+experiment=gpt_tiny", f"data.cache_dir={tmp_path / 'cache'}", "logger.mode=disabled"])
    visits, calls = config_path(cfg, tmp_path / "run")
    assert visits[0] == "cli/run.py" and visits[-1] == "training/compiled.py"
    assert len(set(visits)) <= 25, sorted(set(visits))
    assert climbs(visits) <= 10, visits
    assert calls.count("with_values") == 1  # the derived values laid over the composed config once
    assert calls.count("resolve") == 1


def test_the_vocabulary_completes_the_spec_once_known(tmp_path):
    from theseus.recipe import resolve

    spec = resolve(compose(["+experiment=gpt_tiny"]))
    assert spec.vocab_size is None and spec.record["architecture"]["vocab_size"] is None
    done = spec.with_vocabulary(257)  # byte's: padded to a multiple of 128
    assert (done.vocab_size, done.record["architecture"]["vocab_size"], done.values.get("architecture.vocab_size")) \
        == (384, 384, 384)
    assert spec.vocab_size is None  # frozen: completed into a new spec
    declared = resolve(compose(["+experiment=gpt_tiny", "architecture.vocab_size=300"]))
    assert declared.with_vocabulary(257).vocab_size == 300
    with pytest.raises(ConfigError, match=r"^architecture.vocab_size=300 is smaller than the tokenizer's vocabulary "
                                          r"\(301\): set architecture.vocab_size>=301 or leave it unset$"):
        declared.with_vocabulary(301)
