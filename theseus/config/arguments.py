"""The entry points' own arguments (``sample``, ``export``, ``report``, ``launch``): a mistake is
one line, ``theseus: error: ...``, exit 2, as a config mistake is (argparse's usage block is
what ``--help`` is for), and numbers are checked against their range where they are parsed."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable, Sequence


def plain(text: str) -> str:
    """A docstring as a terminal shows it: reStructuredText's inline literals (````x````) unmarked."""
    return re.sub(r"``(.+?)``", r"\1", text)


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line naming the argument and where the usage is; an
    unknown option is told the option it resembles (``--max_new_tokens``: ``--max-new-tokens``)."""

    def __init__(self, *, description: str | None = None, **kwargs) -> None:
        super().__init__(description=description and plain(description), **kwargs)

    def error(self, message: str):
        self.exit(2, f"theseus: error: {message} (usage: {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):  # argparse's signatures; unknown arguments refused here
        return self._known(*self.parse_known_args(args, namespace))

    def parse_intermixed_args(self, args=None, namespace=None):
        return self._known(*self.parse_known_intermixed_args(args, namespace))

    def _known(self, namespace: argparse.Namespace, unknown: Sequence[str]) -> argparse.Namespace:
        """``namespace``, or argparse's error for ``unknown`` arguments, with a did-you-mean."""
        if unknown:
            hint = did_you_mean(unknown, list(self._option_string_actions))
            self.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
        return namespace


def did_you_mean(unknown: Sequence[str], options: Sequence[str]) -> str:
    """``; did you mean --max-new-tokens?`` for the first unknown option (its ``=VALUE`` aside)
    close to one of ``options``, dashes and underscores alike; else nothing."""
    names = {name(option): option for option in options}
    for arg in unknown:
        close = difflib.get_close_matches(name(arg.partition("=")[0]), names, n=1, cutoff=0.8)
        if arg.startswith("-") and close:
            return f"; did you mean {names[close[0]]}?"
    return ""


def name(option: str) -> str:
    """``--max_new_tokens`` -> ``max-new-tokens``: an option as it is compared."""
    return option.lstrip("-").replace("_", "-")


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
