"""Reward functions: a user's Python functions that score completions, with TRL's signature.

    # rewards.py beside the command: grpo.reward=rewards:correct
    def correct(prompts, completions, completion_ids, answer, **kwargs) -> list[float | None]:
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

Each function is called once a step with every completion of this process: ``prompts`` (each
completion's prompt, as its row gives it: a string or messages), ``completions`` (strings; for a
conversational prompt ``[{"role": "assistant", "content": ...}]``), ``completion_ids`` (lists of
token ids), and every other column of the prompt rows by name (a list, one value per
completion). None means unscorable: a completion every function returns None for gets
advantage 0 and counts in no reward statistic. The weighted sum of the functions' rewards
(``grpo.reward_weights``, default 1 each; None skipped) is the completion's reward, as TRL sums it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Real

import numpy as np

from theseus.config import ConfigError
from theseus.config.discovery import object_spec, user_object
from theseus.tasks.task import BatchError


class RewardError(BatchError):
    """A reward function that raised, or returned what is not one reward per completion."""


@dataclasses.dataclass(frozen=True)
class Rewards:
    """The reward functions of ``grpo.reward`` (``specs``: ``module:function`` each) and their weights."""

    specs: tuple[str, ...]
    functions: tuple[Callable, ...] = dataclasses.field(repr=False)
    weights: np.ndarray = dataclasses.field(repr=False)  # float32 [functions]

    @staticmethod
    def check(specs: str | Sequence[str], weights: Sequence[float] | None = None) -> tuple[str, ...]:
        """The specs of ``grpo.reward`` as a tuple, each ``module:function``, with one weight each
        (``grpo.reward_weights``) if any: ConfigError naming the key otherwise (nothing imported)."""
        specs = (specs,) if isinstance(specs, str) else tuple(specs) if isinstance(specs, list | tuple) else specs
        if not isinstance(specs, tuple) or not all(isinstance(spec, str) for spec in specs):
            raise ConfigError(f"grpo.reward must be module:function or a list of them, got {specs!r}: e.g. "
                              f"grpo.reward=rewards:correct or 'grpo.reward=[rewards:correct,rewards:short]'")
        if not specs:
            raise ConfigError("grpo.reward is empty: give a reward function, e.g. grpo.reward=rewards:correct")
        for spec in specs:
            object_spec(spec, "grpo.reward")
        if weights is not None and len(weights) != len(specs):
            raise ConfigError(f"grpo.reward_weights has {len(weights)} weight(s) for {len(specs)} reward function(s) "
                              f"({', '.join(specs)}): give one each, or leave it unset (1 each)")
        return specs

    @classmethod
    def load(cls, specs: str | Sequence[str], weights: Sequence[float] | None = None) -> Rewards:
        """Import each ``module:function`` (``user_object``) once ``check``ed; ConfigError naming
        the key for one that does not import or is not callable."""
        specs = cls.check(specs, weights)
        functions = tuple(user_object(spec, "grpo.reward") for spec in specs)
        for spec, function in zip(specs, functions):
            if not callable(function):
                raise ConfigError(f"grpo.reward={spec} is not a function (a {type(function).__name__}): name one "
                                  f"taking (prompts, completions, completion_ids, **columns)")
        return cls(specs, functions, np.asarray(weights if weights is not None else [1.0] * len(specs), np.float32))

    def check_arguments(self, columns: Sequence[str]) -> None:
        """ConfigError, before any completion is sampled, for a function that cannot be called as
        ``score`` calls it: with ``prompts``, ``completions``, ``completion_ids`` and ``columns`` (the
        prompt rows' other fields) by name (a parameter the rows do not give, or a column it takes
        neither by name nor as ``**kwargs``)."""
        given = dict.fromkeys(("prompts", "completions", "completion_ids", *columns))
        for spec, function in zip(self.specs, self.functions):
            try:
                signature = inspect.signature(function)
            except (TypeError, ValueError):  # a builtin's: its call says
                continue
            try:
                signature.bind(**given)
            except TypeError as exc:
                raise ConfigError(f"grpo.reward={spec} cannot take the arguments it is called with: "
                                  f"{_unfit(signature, given)}") from exc

    @property
    def names(self) -> tuple[str, ...]:
        """Each function's name, as TRL logs it (``rewards/NAME/mean``)."""
        return tuple(getattr(function, "__name__", spec) for spec, function in zip(self.specs, self.functions))

    def score(self, prompts: Sequence, completions: Sequence, completion_ids: Sequence[list[int]],
              columns: Mapping[str, Sequence]) -> np.ndarray:
        """float32 ``[completions, functions]``: each function's reward of each completion, NaN for
        None. RewardError, naming the function and a prompt, for one that raises or returns other
        than one number or None per completion."""
        scores = np.empty((len(completions), len(self.functions)), np.float32)
        for j, (spec, function) in enumerate(zip(self.specs, self.functions)):
            scores[:, j] = self._call(spec, function, prompts, completions, completion_ids, columns)
        return scores

    def total(self, scores: np.ndarray) -> np.ndarray:
        """float32 ``[completions]``: the weighted sum of ``scores`` over the functions, NaN ones
        left out; NaN where every function's is (unscorable)."""
        summed = np.nansum(scores * self.weights, axis=1)
        return np.where(np.isnan(scores).all(axis=1), np.nan, summed).astype(np.float32)

    def _call(self, spec: str, function: Callable, prompts: Sequence, completions: Sequence,
              completion_ids: Sequence[list[int]], columns: Mapping[str, Sequence]) -> np.ndarray:
        def call(rows: Sequence[int]):
            return function(prompts=[prompts[i] for i in rows], completions=[completions[i] for i in rows],
                            completion_ids=[completion_ids[i] for i in rows],
                            **{name: [values[i] for i in rows] for name, values in columns.items()})

        every = range(len(completions))
        try:
            values = call(every)
        except Exception as exc:  # noqa: BLE001 - any error of the user's function stops the run in one line
            row = next((i for i in every if _raises(call, i)), 0)  # the first completion it fails on alone
            raise RewardError(f"grpo.reward {spec} raised {type(exc).__name__}: {_line(exc)} on the prompt "
                              f"{shown(prompts[row])}") from exc
        try:
            values = list(values)
        except TypeError:
            values = None
        if values is None or len(values) != len(completions):
            got = "a value that is not a list" if values is None else f"{len(values)} rewards"
            raise RewardError(f"grpo.reward {spec} returned {got} for {len(completions)} completions (the first of "
                              f"the prompt {shown(prompts[0])}): return one float or None per completion")
        for i, value in enumerate(values):
            if value is not None and not isinstance(value, Real):
                raise RewardError(f"grpo.reward {spec} returned {value!r:.40} for a completion of the prompt "
                                  f"{shown(prompts[i])}: return one float or None per completion")
        return np.asarray([math.nan if value is None else float(value) for value in values], np.float32)


def _unfit(signature: inspect.Signature, given: Mapping[str, object]) -> str:
    """Why ``signature`` does not bind the keyword arguments ``given``, and the fix."""
    params = signature.parameters.values()
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    positional = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional:
        return f"its parameter {positional[0]!r} is positional-only, and every argument is passed by name: drop the /"
    needed = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
              and p.name not in given]
    if needed:
        columns = ", ".join(name for name in given if name not in ("prompts", "completions", "completion_ids"))
        return (f"its parameter {needed[0]!r} is given nothing (it gets prompts, completions, completion_ids and "
                f"the prompt rows' columns by name: {columns or 'none'}): give the rows a {needed[0]!r} field, or the "
                f"parameter a default")
    extra = [name for name in given if name not in named]
    return (f"it takes no {extra[0]!r} (a column of the prompt rows, passed by name as TRL passes it): add **kwargs "
            f"to its parameters")


def _raises(call: Callable, row: int) -> bool:
    try:
        call([row])
    except Exception:  # noqa: BLE001
        return True
    return False


def _line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200] or "(no message)"


def shown(text: object, limit: int = 80) -> str:
    """A prompt or completion in a line, quoted: its text (a conversation's last message), its
    whitespace runs as one space, cut at ``limit`` characters."""
    if isinstance(text, list) and text and isinstance(text[-1], Mapping):
        text = text[-1].get("content", text)
    text = " ".join(str(text).split())
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")
