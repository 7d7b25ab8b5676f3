"""field(), configure(), configuration(), gather() on plain dataclasses and modules."""

from __future__ import annotations

import dataclasses
import re

import pytest
from omegaconf import OmegaConf

from theseus.config import (
    FRACTION,
    NON_NEGATIVE,
    PLANNING,
    POSITIVE,
    SEED,
    ConfigError,
    Configurable,
    Range,
    configuration,
    configure,
    derive,
    field,
    gather,
    keys_with,
    schema_of,
    specs,
    structured,
)


@dataclasses.dataclass
class Settings(Configurable):
    lr: float = field("optimizer/lr", default=3e-4, help="peak learning rate")
    steps: int = field("trainer/max_steps", default=10)
    name: str | None = field("logger/name", default=None)
    tags: list[str] = field("logger/tags", default=[])
    path: str = field("data/path", help="required: no default")


class Leaf(Configurable):
    pass


@dataclasses.dataclass
class A(Configurable):
    width: int = field("architecture/width", default=4)

    @classmethod
    def components(cls):
        return [Leaf, B]


@dataclasses.dataclass
class B(Configurable):
    width: int = field("architecture/width", default=4)

    @classmethod
    def components(cls):
        return [Leaf, A]  # a cycle and a repeat: each type once


def test_specs_carry_key_type_default_help():
    by_key = {s.key: s for s in specs(Settings)}
    assert by_key["optimizer.lr"].type is float and by_key["optimizer.lr"].help == "peak learning rate"
    assert by_key["data.path"].required
    assert by_key["logger.name"].default is None


def test_configure_from_dict_dictconfig_and_defaults():
    with pytest.raises(ConfigError, match="data.path is required by Settings"):
        configure(Settings)
    s = configure(Settings, path="x")
    assert (s.lr, s.steps, s.tags) == (3e-4, 10, [])
    with configuration({"optimizer": {"lr": 1}, "data.path": "corpus", "trainer/max_steps": 7}):
        s = configure(Settings)
    assert s.lr == 1.0 and isinstance(s.lr, float) and s.steps == 7 and s.path == "corpus"
    with configuration(OmegaConf.create({"logger": {"tags": ["a", "b"]}, "data": {"path": "p"}})):
        s = configure(Settings, lr=0.5)
    assert s.tags == ["a", "b"] and s.lr == 0.5


def test_configure_rejects_wrong_types():
    with configuration({"trainer.max_steps": "abc", "data.path": "p"}), pytest.raises(ConfigError, match="trainer.max_steps must be int, got 'abc'"):
        configure(Settings)
    with configuration({"trainer.max_steps": True, "data.path": "p"}), pytest.raises(ConfigError, match="must be int"):
        configure(Settings)


def test_nested_configurations_restore():
    with configuration({"data.path": "outer"}):
        with configuration({"data.path": "inner"}):
            assert configure(Settings).path == "inner"
        assert configure(Settings).path == "outer"


def test_gather_is_unique_and_ordered():
    assert gather(A) == [A, Leaf, B]
    assert A.gather() == [A, Leaf, B] and B.gather() == [B, Leaf, A]


def test_shared_key_agrees():
    assert list(schema_of(A)) == ["architecture.width"]


def test_conflicting_default_names_both_classes():
    @dataclasses.dataclass
    class C:
        width: int = field("architecture/width", default=5)

    with pytest.raises(ConfigError, match=r"architecture.width .*different defaults \(4 vs 5\).*A.width and .*C.width"):
        derive([A, C])


def test_conflicting_type_names_both_classes():
    @dataclasses.dataclass
    class D:
        width: float = field("architecture/width", default=4.0)

    with pytest.raises(ConfigError, match=r"architecture.width .*different types.*A.width and .*D.width"):
        derive([A, D])


def test_value_and_group_on_one_key_conflict():
    @dataclasses.dataclass
    class E:
        leaf: int = field("architecture/width/inner", default=1)

    with pytest.raises(ConfigError, match="architecture.width is declared as a value"):
        derive([A, E])


def test_structured_schema_types_and_missing():
    cfg = structured(schema_of(Settings))
    assert cfg.optimizer.lr == 3e-4 and OmegaConf.is_missing(cfg.data, "path")
    assert OmegaConf.to_yaml(cfg).count("???") == 1
    with pytest.raises(Exception, match="could not be converted to Integer"):
        cfg.trainer.max_steps = "abc"
    with pytest.raises(Exception, match="not in"):
        cfg.trainer.max_stpes = 3  # struct: unknown keys are errors


def test_bad_key_is_rejected_at_declaration():
    with pytest.raises(ValueError, match="must be identifiers"):
        field("architecture/n-layers", default=1)


def test_a_keys_role_is_declared_with_it_and_found_by_keys_with():
    @dataclasses.dataclass
    class Run:
        seed: int = field("trainer.seed", default=0, role=SEED)
        dry_run: bool = field("trainer.dry_run", default=False, role=PLANNING)
        lr: float = field("optimizer.lr", default=1e-3)

    @dataclasses.dataclass
    class Data:
        seed: int = field("data.seed", default=0, role=SEED)
        again: int = field("trainer.seed", default=0, role=SEED)  # a shared key is found once

    assert keys_with(SEED, Run, Data) == ("trainer.seed", "data.seed")
    assert keys_with(PLANNING, Run, Data) == ("trainer.dry_run",)

    @dataclasses.dataclass
    class Silent:  # declares trainer.seed without its role: the other declaration gives it
        seed: int = field("trainer.seed", default=0)

    @dataclasses.dataclass
    class Planned:
        seed: int = field("trainer.seed", default=0, role=PLANNING)

    assert derive([Silent, Run])["trainer.seed"].role == SEED
    with pytest.raises(ConfigError, match=r"trainer.seed is declared with different roles \(seed vs planning\) by "
                                          r".*Run.seed and .*Planned.seed"):
        derive([Run, Planned])
    with pytest.raises(ValueError, match=r"optimizer.lr: role='sed' is not one of seed, planning"):
        field("optimizer.lr", default=1e-3, role="sed")


@pytest.mark.parametrize("check, words", [
    (POSITIVE, "positive"), (NON_NEGATIVE, "0 or more"), (FRACTION, "in [0, 1)"), (Range(gt=0, lt=1), "in (0, 1)"),
    (Range(gt=0, le=1), "in (0, 1]"), (Range(ge=1), "1 or more"), (Range(le=2.5), "at most 2.5"),
    (Range(ge=0, says="0 (no thread) or more"), "0 (no thread) or more"),
])
def test_a_range_says_its_bounds_in_words(check, words):
    assert check.words() == words


def test_a_declared_range_is_one_line_at_construction_with_a_fix():
    @dataclasses.dataclass(frozen=True)
    class Counts(Configurable):
        steps: int = field("probe.steps", default=10, check=POSITIVE)
        rate: float = field("probe.rate", default=0.5, check=Range(gt=0, lt=1, fix="halve it"))
        cap: int | None = field("probe.cap", default=None, check=Range(ge=1))

    assert Counts(cap=None).cap is None  # None is for the type to allow, not the range
    with pytest.raises(ConfigError, match=r"^probe.steps must be positive, got 0: e.g. probe.steps=10$"):
        Counts(steps=0)
    with pytest.raises(ConfigError, match=r"^probe.rate must be in \(0, 1\), got 1.5: halve it$"):
        configure(Counts, rate=1.5)
    with configuration({"probe.cap": 0}), pytest.raises(ConfigError, match=r"^probe.cap must be 1 or more, got 0$"):
        configure(Counts)


def _outside(check: Range, tp) -> float:
    """A value just outside ``check``: below its lower bound, else above its upper one."""
    low, high = (check.gt if check.gt is not None else check.ge), (check.lt if check.lt is not None else check.le)
    value = low - 1 if low is not None else high + 1
    return int(value) if "int" in str(tp) else float(value)


def test_every_declared_range_is_enforced_by_its_class():
    """Each field of theseus's options declared with a range refuses a value outside it, in
    its own words, wherever the class that declares it is built."""
    from theseus.config import registry

    registry.load()
    checked = set()  # (declaring class, attribute): each declaration once, built as the first class that has it
    for group in registry.groups():
        for cls in registry.options(group).values():
            for built in gather(cls):
                for spec in specs(built):
                    if spec.check is None or (spec.owner, spec.name) in checked:
                        continue
                    bad = _outside(spec.check, spec.type)
                    with configuration({"architecture.vocab_size": 64}), pytest.raises(
                            ConfigError, match=f"^{re.escape(spec.key)} must be {re.escape(spec.check.words())}"):
                        configure(built, **{spec.name: bad})
                    checked.add((spec.owner, spec.name))
    assert len(checked) >= 30, sorted(f"{owner.__name__}.{name}" for owner, name in checked)
