"""Each ``architecture.*`` key is declared once: by one ``field()`` call in the source, so that
every class reading it agrees on its type, default, range, role and help."""

from __future__ import annotations

import ast
import collections
import importlib
import pathlib
import pkgutil

import theseus
from theseus.config import Configurable, specs
from theseus.model import architecture

PACKAGE = pathlib.Path(theseus.__file__).parent


def field_calls(key_prefix: str) -> dict[str, list[str]]:
    """Every ``field("<key>", ...)`` call in the package whose literal key starts with ``key_prefix``:
    key -> ``file:line`` of each call."""
    calls = collections.defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "field" and node.args
                    and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith(key_prefix)):
                calls[node.args[0].value].append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return calls


def theseus_classes() -> list[type]:
    """Every configurable class the package's model, stateful and training layers define."""
    for folder in ("model", "stateful", "training"):
        for info in pkgutil.walk_packages([str(PACKAGE / folder)], f"theseus.{folder}."):
            importlib.import_module(info.name)
    found, todo = [], [Configurable]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("theseus."):
            found.append(cls)
    return found


def test_no_architecture_key_is_declared_by_two_field_calls():
    twice = {key: where for key, where in field_calls("architecture.").items() if len(where) > 1}
    assert not twice, f"declare these once, in theseus/model/architecture.py: {twice}"


def test_the_scan_sees_a_layers_own_key_and_not_the_shared_ones():
    calls = field_calls("architecture.")  # the factories' one field() call has an f-string key
    assert [where.split(":")[0] for where in calls["architecture.post_norms"]] == ["theseus/model/layers.py"]
    assert "architecture.d_model" not in calls


def test_every_class_reading_a_key_declares_it_alike():
    declarations = collections.defaultdict(dict)
    for cls in theseus_classes():
        for spec in specs(cls):
            if spec.key.startswith("architecture."):
                declarations[spec.key][(spec.type, repr(spec.default), spec.help, spec.choices, spec.check,
                                        spec.role)] = cls.__qualname__
    assert len(declarations["architecture.d_model"]) == 1
    differ = {key: list(variants.values()) for key, variants in declarations.items() if len(variants) > 1}
    assert not differ, f"declared differently by: {differ}"


def test_readers_of_d_model_share_one_declaration():
    readers = {cls.__qualname__ for cls in theseus_classes()
               if any(spec.key == "architecture.d_model" for spec in specs(cls))}
    assert {"Embedding", "PositionEmbedding", "LayerNorm", "RMSNorm", "MLP", "Attention", "MoE", "GPT"} <= readers


def test_a_factory_makes_a_new_field_each_call():
    first, second = architecture.d_model(), architecture.d_model()
    assert first is not second
    assert first.metadata == second.metadata and first.default == second.default == 768
