"""Seed groups: runs that differ only in a seed, their mean and 95% confidence interval of a
final metric, and Welch's t-test of the best group against each other one.

    groups = seed_groups([({"optimizer.lr": 1e-3, "trainer.seed": 0}, 2.31), ...])
    groups[0].mean, groups[0].ci, groups[1].p  # best first; p: does the best beat this group?

Lower is better (the metric is a loss). The interval is the t interval of the mean,
``mean +- t(0.975, n-1) * s / sqrt(n)`` with the sample standard deviation ``s``; Welch's test
does not assume equal variances (df from the Welch-Satterthwaite equation), one-sided
(H1: the best group's mean is lower), as a claim of improvement is one-sided.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from theseus.config import SEED, keys_with
from theseus.data.config import DataConfig
from theseus.training.config import TrainerConfig

SEED_KEYS = keys_with(SEED, TrainerConfig, DataConfig)  # trainer.seed, data.seed
LEVEL = 0.95


@dataclasses.dataclass(frozen=True)
class Group:
    """The runs of one setting of the non-seed keys."""

    params: dict[str, Any]  # the non-seed swept keys and their values
    values: tuple[float, ...]  # the final metric of each seed
    mean: float
    ci: float | None  # half-width of the 95% interval of the mean (None for a single seed)
    p: float | None  # Welch's one-sided p-value that the best group is lower (None: this is the best, or n < 2)
    t: float | None
    df: float | None

    @property
    def n(self) -> int:
        return len(self.values)

    def describe(self, digits: int = 4) -> str:
        """``2.3100 +- 0.0123 (n=3)``, or ``2.3100 (single seed)``."""
        if self.ci is None:
            return f"{self.mean:.{digits}f} (single seed)"
        return f"{self.mean:.{digits}f} +- {self.ci:.{digits}f} (n={self.n})"


def interval(values: Sequence[float], level: float = LEVEL) -> float | None:
    """Half-width of the t confidence interval of the mean of ``values`` (None below 2 values)."""
    n = len(values)
    if n < 2:
        return None
    return float(_t().stdtrit(n - 1, 0.5 + level / 2) * _sd(values) / math.sqrt(n))  # t quantile


def welch(best: Sequence[float], other: Sequence[float]) -> tuple[float, float, float] | None:
    """Welch's t-test that ``best``'s mean is lower than ``other``'s: (t, df, one-sided p).
    None unless both have 2 values or more and some spread."""
    if len(best) < 2 or len(other) < 2:
        return None
    va, vb = _sd(best) ** 2 / len(best), _sd(other) ** 2 / len(other)
    diff = sum(other) / len(other) - sum(best) / len(best)
    if va + vb == 0:
        return None
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(best) - 1) + vb ** 2 / (len(other) - 1))
    return float(t), float(df), float(_t().stdtr(df, -t))  # t's survival function at t


def seed_keys(params: Sequence[Mapping[str, Any]]) -> list[str]:
    """The seed keys that take more than one value among ``params``."""
    return [key for key in SEED_KEYS if len({repr(p.get(key)) for p in params}) > 1]


def seed_groups(results: Sequence[tuple[Mapping[str, Any], float]]) -> list[Group]:
    """Group ``(params, final metric)`` pairs by every key but the seeds; best (lowest mean)
    first, each other group with Welch's p-value against the best."""
    seeds = seed_keys([params for params, _ in results])
    buckets: dict[str, tuple[dict[str, Any], list[float]]] = {}
    for params, value in results:
        rest = {key: value for key, value in params.items() if key not in seeds}
        buckets.setdefault(repr(sorted(rest.items())), (rest, []))[1].append(float(value))
    ordered = sorted(buckets.values(), key=lambda bucket: sum(bucket[1]) / len(bucket[1]))
    best = ordered[0][1] if ordered else []
    groups = []
    for i, (params, values) in enumerate(ordered):
        test = welch(best, values) if i else None
        groups.append(Group(params, tuple(values), sum(values) / len(values), interval(values),
                            test and test[2], test and test[0], test and test[1]))
    return groups


def _t():
    """scipy's special functions (the t distribution), imported by the summaries that use them:
    0.2 s of every command's start otherwise (scipy.stats would add seconds)."""
    from scipy import special

    return special


def _sd(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
