"""ConfigError: one line naming the key that is wrong and how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration mistake, reported to the user in one line (no traceback)."""


def suggest(key: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known keys closest to a misspelt ``key``, best first.

    Keys under the same parent with a close leaf come first (``architecture.scael`` ->
    ``architecture.scale``; a misspelt parent is read as its closest one: ``optimiser.lr`` ->
    ``optimizer.lr``), then whole keys that are very close.
    """
    known = list(known)
    prefix, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == prefix}
    if not siblings and prefix:  # the group itself misspelt (optimiser.lr): its closest group's keys
        groups = {k.rpartition(".")[0] for k in known}
        for group in difflib.get_close_matches(prefix, list(groups), n=1, cutoff=0.6):
            siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == group}
    found = [siblings[c] for c in difflib.get_close_matches(leaf, list(siblings), n=n, cutoff=0.6)]
    for close in difflib.get_close_matches(key, known, n=n, cutoff=0.8):
        if close not in found:
            found.append(close)
    return found[:n]
