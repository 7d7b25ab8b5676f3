"""A chat corpus every machine has: questions about the standard library's public functions and
classes, answered by the first paragraph of their docstrings (``data.source=stdlib`` under
``task=sft``).

    {"messages": [{"role": "user", "content": "What does json.dumps do?"},
                  {"role": "assistant", "content": "Serialize ``obj`` to a JSON formatted ``str``."}]}
"""

from __future__ import annotations

import ast
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from theseus.data.sources import stdlib_files

MAX_ANSWER = 400  # characters of a docstring's first paragraph kept (whole sentences are not sought)


def stdlib_chats(max_files: int | None = None) -> Iterator[dict]:
    """One conversation per documented public top-level function or class of the first
    ``max_files`` standard library files (all by default), in file order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in stdlib_files()[:max_files]:
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for name, answer in documented(path):
            yield {"messages": [{"role": "user", "content": f"What does {module}.{name} do?"},
                                {"role": "assistant", "content": answer}]}


def documented(path: Path) -> Iterator[tuple[str, str]]:
    """``(name, first paragraph of its docstring)`` of the public top-level functions and classes
    of the Python file ``path`` (none when it does not parse)."""
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            summary = re.sub(r"\s+", " ", doc.strip().split("\n\n")[0]) if doc else ""
            if summary:
                yield node.name, summary[:MAX_ANSWER]
