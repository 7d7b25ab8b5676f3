"""The import graph of theseus is layered and acyclic (README, Layout: config -> base -> model ->
stateful / data -> interop -> sources -> tasks / evaluation -> training -> plan / report -> recipe
-> cli -> the entries users type).

Every module under theseus/ is parsed with ``ast`` (nothing is imported); every ``theseus.*``
import counts, a lazy one inside a function as much as one at the top, since laziness only
hides a cycle. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else
to ``pkg``. The root package ``theseus`` is every module's parent (Python runs it first in any
case), so an edge to it carries no layer. A module's ``if __name__ == "__main__":`` block runs
only when the file is the program (``python -m theseus.data.prepare``), as another module,
``__main__``: its imports are that entry's, not the module's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "theseus"

# The floors, lowest first: an import may go to the same part or a lower floor, never up, and never
# sideways between two different parts of one floor.
FLOORS = [("config",), ("base",), ("model",), ("stateful", "data"), ("interop",), ("sources",), ("tasks", "evaluation"),
          ("training",), ("plan", "report"), ("recipe",), ("cli",)]
LAYERS = {name: level for level, names in enumerate(FLOORS) for name in names}
# Above them, the entries: the package (its lazy API), the ``python -m`` paths users type (each a
# command of cli/), every ``__main__``, the notebook's ``theseus.runs`` and ``theseus.options`` (the
# entry point naming theseus's own options). Any other part is an error (test_every_part_is_placed).
COMMANDS = ("run", "sample", "evaluate", "export", "launch")
ENTRIES = ("theseus", *COMMANDS, "runs", "options")
# A model family: what the generic step, the tasks and the trainer must not know (they reach a
# model's auxiliary losses and own updates through theseus.model.module's channels).
FAMILIES = ("theseus.model.models", "theseus.model.moe", "theseus.stateful")
GENERIC = ("theseus.training.step", "theseus.training.trainer", "theseus.training.compiled")
JOB_TASK = "theseus.tasks.regression"  # the PMM experiment: a job that builds its own stateful models
ENTRY = max(LAYERS.values()) + 1


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package at ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The theseus modules that module ``name`` (its file ``path``) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in (node for top in tree.body if not is_main_block(top) for node in ast.walk(top)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 parents
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import theseus.a.b` names module theseus.a.b
                target = target.rpartition(".")[0]
            if target and target != "theseus" and target != name:
                found.add(target)
    return found


def is_main_block(node: ast.stmt) -> bool:
    """Whether ``node`` is a module's ``if __name__ == "__main__":`` block."""
    return isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the theseus modules it imports."""
    files = modules(root)
    return {name: imports(name, path, set(files)) for name, path in files.items()}


def is_main(module: str) -> bool:
    """A package's command (``python -m theseus.config`` runs ``theseus.config.__main__``)."""
    return module.endswith(".__main__")


def part(module: str) -> str:
    """``theseus.model.layers`` -> ``model``; a top-level module is its own part (``recipe``, ``run``),
    and so is a package's ``__main__``: an entry."""
    return module.split(".")[1] if "." in module and not is_main(module) else module


def layer(module: str) -> int:
    return LAYERS.get(part(module), ENTRY)


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import that goes up the layers, or sideways between parts of one layer."""
    wrong = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            if layer(target) > layer(source) or (
                layer(target) == layer(source) < ENTRY and part(target) != part(source)
            ):
                wrong.append(f"{source} ({part(source)}) imports {target} ({part(target)})")
    return wrong


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected set of modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_package_is_parsed_whole():
    edges = graph()
    assert len(edges) > 60
    assert "theseus.config.fields" in edges["theseus.config"]  # a package's own exports count
    assert "theseus.training.trainer" in edges["theseus.cli.run"]  # lazy imports inside functions count
    assert "theseus.cli.prepare" not in edges["theseus.data.prepare"]  # its __main__ block is the entry's


def test_every_part_is_placed():
    assert sorted({part(m) for m in graph() if not is_main(m)} - set(LAYERS) - set(ENTRIES)) == []


def test_the_command_entries_only_import_their_command():
    edges = graph()
    entries = [m for m in edges if is_main(m) and m != "theseus.__main__" or part(m) in COMMANDS]
    assert len(entries) == 7
    assert {m: sorted(t for t in edges[m] if part(t) != "cli") for m in entries} == {m: [] for m in entries}


def parts(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between parts (config, model, report, sweep, ...): each module's edges to other parts."""
    collapsed: dict[str, set[str]] = {}
    for source, targets in edges.items():
        collapsed.setdefault(part(source), set()).update(part(t) for t in targets if part(t) != part(source))
    return collapsed


def test_no_import_cycle_between_modules():
    assert cycles(graph()) == []


def test_no_import_cycle_between_parts():
    assert cycles(parts(graph())) == []


def test_imports_only_go_down_the_layers():
    assert upward(graph()) == []


def test_the_trainer_imports_no_model():
    assert [m for m in graph()["theseus.training.trainer"] if part(m) == "model"] == []


def test_training_imports_no_interop_and_the_step_and_tasks_no_model_family():
    edges = graph()
    crossings = [f"{source} imports {target}" for source, targets in sorted(edges.items()) for target in sorted(targets)
                 if (part(source) == "training" and part(target) == "interop")
                 or (source in GENERIC or part(source) == "tasks" and source != JOB_TASK) and target.startswith(FAMILIES)]
    assert crossings == []


KIND_NAMES = {"hf", "gguf", "run"}  # theseus.sources.model_source.KINDS' names


def kind_comparisons(root: Path = PACKAGE) -> list[str]:
    """``FILE:LINE`` of each comparison of an attribute ``kind`` with a model source's kind
    (``source.kind == "run"``, ``!=``, ``in ("hf", "gguf")``) outside ``theseus/sources/``: a model
    source's kind is its class's to answer, by its methods. (``inspect.Parameter.kind`` is no such.)"""
    def names_a_kind(node: ast.expr) -> bool:
        elements = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(e, ast.Constant) and e.value in KIND_NAMES for e in elements)

    found = []
    for name, path in modules(root).items():
        if part(name) == "sources":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            sides = (node.left, *node.comparators) if isinstance(node, ast.Compare) else ()
            if any(isinstance(side, ast.Attribute) and side.attr == "kind" for side in sides) and any(
                    map(names_a_kind, sides)):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_no_model_source_kind_is_compared_outside_the_sources():
    assert kind_comparisons() == []


def test_a_kind_compared_outside_the_sources_is_found(package):
    root = package({"__init__.py": "", "sources/__init__.py": "", "sources/s.py": "ok = source.kind == 'run'\n",
                    "cli/__init__.py": "", "cli/c.py": "a = source.kind != 'run'\nb = p.kind in (p.A, p.B)\n"
                                                        "c = base.kind in ('hf', 'gguf')\nd = 'gguf' == base.kind\n"})
    assert kind_comparisons(root) == ["theseus/cli/c.py:1", "theseus/cli/c.py:3", "theseus/cli/c.py:4"]


@pytest.fixture
def package(tmp_path: Path):
    """Write a small package ``theseus`` under tmp_path: {relative file: source}."""

    def write(files: dict[str, str]) -> Path:
        for relative, source in files.items():
            path = tmp_path / "theseus" / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
        return tmp_path / "theseus"

    return write


def test_a_lazy_cycle_and_an_upward_import_are_found(package):
    root = package({
        "__init__.py": "",
        "model/__init__.py": "",
        "model/a.py": "def f():\n    from theseus.model import b\n",
        "model/b.py": "from . import a\n",
        "config/__init__.py": "",
        "config/c.py": "import theseus.training.t\n",
        "training/__init__.py": "",
        "training/t.py": "from theseus.model.a import f\n",
        "run.py": "from theseus.training import t\n",
        "sweep.py": "from theseus.viewer.rundir import Run\n",
        "viewer/__init__.py": "",
        "viewer/rundir.py": "",
        "viewer/page.py": "from theseus.sweep import collect\n",
    })
    edges = graph(root)
    assert edges["theseus.model.b"] == {"theseus.model.a"}  # relative import resolved
    assert cycles(edges) == [["theseus.model.a", "theseus.model.b"]]
    assert upward(edges) == ["theseus.config.c (config) imports theseus.training.t (training)"]
    assert cycles(parts(edges)) == [["sweep", "viewer"]]  # no module cycle, but the parts import each other


def test_sideways_between_parts_of_one_layer_is_refused(package):
    root = package({"__init__.py": "", "data/__init__.py": "", "data/d.py": "from theseus.stateful import s\n",
                    "stateful/__init__.py": "", "stateful/s.py": ""})
    assert upward(graph(root)) == ["theseus.data.d (data) imports theseus.stateful.s (stateful)"]
