"""A chat corpus every machine has: questions about the standard library's public functions and
classes, answered by the first paragraph of their docstrings (``data.source=stdlib`` under
``task=sft``), and preference pairs of the same answers (under ``task=dpo``): the answer chosen,
its words scrambled rejected.

    {"messages": [{"role": "user", "content": "What does json.dumps do?"},
                  {"role": "assistant", "content": "Serialize ``obj`` to a JSON formatted ``str``."}]}
    {"prompt": [{"role": "user", "content": "What does json.dumps do?"}],
     "chosen": [{"role": "assistant", "content": "Serialize ``obj`` to a JSON formatted ``str``."}],
     "rejected": [{"role": "assistant", "content": "JSON ``str``. to formatted a Serialize ``obj``"}]}
"""

from __future__ import annotations

import ast
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from theseus.data.corpus_files import stdlib_files

MAX_ANSWER = 400  # characters of a docstring's first paragraph kept (whole sentences are not sought)
MIN_WORDS = 4  # words of an answer a preference pair scrambles, at least


def stdlib_chats(max_files: int | None = None) -> Iterator[dict]:
    """One conversation per documented public top-level function or class of the first
    ``max_files`` standard library files (all by default), in file order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in stdlib_files()[:max_files]:
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for name, answer in documented(path):
            yield {"messages": [{"role": "user", "content": f"What does {module}.{name} do?"},
                                {"role": "assistant", "content": answer}]}


def stdlib_pairs(max_files: int | None = None, seed: int = 0) -> Iterator[dict]:
    """One preference pair per conversation of ``stdlib_chats`` whose answer has at least
    ``MIN_WORDS`` words: the answer chosen, the same words in an order drawn from ``(seed, its
    index)`` rejected (a fluent answer preferred to a scrambled one of the same tokens)."""
    for index, chat in enumerate(stdlib_chats(max_files)):
        question, answer = chat["messages"]
        words = answer["content"].split(" ")
        scrambled = " ".join(np.random.default_rng((seed, index)).permutation(words))
        if len(words) >= MIN_WORDS and scrambled != answer["content"]:
            yield {"prompt": [question], "chosen": [answer], "rejected": [{"role": "assistant", "content": scrambled}]}


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
