"""The entry points' own arguments (``sample``, ``export``, ``report``, ``launch``): a mistake is
one line, ``theseus: error: ...``, exit 2, as a config mistake is (argparse's usage block is
what ``--help`` is for), and numbers are checked against their range where they are parsed."""

from __future__ import annotations

import argparse
from collections.abc import Callable


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line naming the argument and where the usage is."""

    def error(self, message: str):
        self.exit(2, f"theseus: error: {message} (usage: {self.prog} --help)\n")


def number(kind: type, low: float, says: str, high: float | None = None) -> Callable[[str], int | float]:
    """An argparse ``type``: ``kind(text)`` within ``[low, high]``, else ``ARG must be SAYS, got TEXT``."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value != value or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {says}, got {text!r}")
        return value
    return parse


PORT = number(int, 0, "a port from 1 to 65535 (0: any free one)", 65535)
POSITIVE_INT = number(int, 1, "a whole number of at least 1")
NON_NEGATIVE_INT = number(int, 0, "a whole number of at least 0")
NON_NEGATIVE = number(float, 0, "0 or more")
PROBABILITY = number(float, 0, "between 0 and 1", 1)
