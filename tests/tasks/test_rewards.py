"""grpo.reward: a user's module:function found beside the command or in the project folder, called
with TRL's signature (columns by name, None as unscorable), weighted as TRL weights; a function
that raises or returns the wrong length is one line naming it and the prompt."""

from __future__ import annotations

import itertools
import sys
import textwrap

import numpy as np
import pytest

from theseus.config import ConfigError
from theseus.tasks.rewards import RewardError, Rewards

_names = itertools.count()


def module(folder, body: str) -> str:
    """A module of a name no other test imported, written into ``folder``: its name."""
    name = f"user_rewards_{next(_names)}"
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return name


SCORES = """
    def exact(prompts, completions, completion_ids, answer, **kwargs):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    def length(prompts, completions, completion_ids, **kwargs):
        return [None if not ids else -len(ids) / 10 for ids in completion_ids]

    def calls(prompts, completions, completion_ids, **kwargs):
        calls.seen.append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs))
        return [0.5] * len(prompts)
    calls.seen = []
"""


def test_functions_beside_the_command_get_every_column_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = module(tmp_path, SCORES)
    rewards = Rewards.load([f"{name}:exact", f"{name}:length", f"{name}:calls"], [1.0, 2.0, 0.0])
    assert rewards.names == ("exact", "length", "calls")
    prompts = ["1+1=", "1+1=", "2+2="]
    scores = rewards.score(prompts, [" 2", "3", "4"], [[50, 10], [51], []], {"answer": ["2", "2", "4"], "id": [7, 7, 8]})
    np.testing.assert_allclose(scores, [[1, -0.2, 0.5], [0, -0.1, 0.5], [1, np.nan, 0.5]], rtol=1e-6)
    seen = sys.modules[name].calls.seen[-1]
    assert seen == {"prompts": prompts, "completions": [" 2", "3", "4"], "completion_ids": [[50, 10], [51], []],
                    "answer": ["2", "2", "4"], "id": [7, 7, 8]}
    # TRL's sum: weights times rewards, None left out; NaN only where every function gave None
    np.testing.assert_allclose(rewards.total(scores), [1 - 0.4, -0.2, 1.0], rtol=1e-6)
    assert np.isnan(rewards.total(np.array([[np.nan, np.nan, np.nan]], np.float32)))[0]


def test_functions_in_the_project_folder_are_found_from_below_it(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.theseus]\nimports = []\n')
    name = module(tmp_path, SCORES)
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path / "runs")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert Rewards.load(f"{name}:exact").names == ("exact",)


@pytest.mark.parametrize(("spec", "says"), [
    ("rewards", "is not module:function"),
    (3, "grpo.reward must be module:function or a list of them, got 3"),
    (["rewards:a", 4], "grpo.reward must be module:function or a list of them"),
    ("rewards:", "is not module:function"),
    ("no_such_module_here:f", "cannot import 'no_such_module_here', asked for by grpo.reward=no_such_module_here:f "
                              r"\(looked for in .*\): ModuleNotFoundError"),
    ("broken_rewards_here:f", r"cannot import 'broken_rewards_here', .*: SyntaxError: .*\(broken_rewards_here.py, "
                              r"line 1\)"),
])
def test_a_function_that_is_not_there_is_one_line(tmp_path, monkeypatch, spec, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_rewards_here.py").write_text("def f(:\n    return []\n")  # does not parse
    with pytest.raises(ConfigError, match=says) as error:
        Rewards.load(spec)
    assert "grpo.reward=" in str(error.value) and "\n" not in str(error.value)


def test_a_missing_name_a_non_function_and_wrong_weights_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = module(tmp_path, SCORES + "\n    THRESHOLD = 3\n")
    with pytest.raises(ConfigError, match=f"grpo.reward={name}:nothing: the module {name} .* has no nothing"):
        Rewards.load(f"{name}:nothing")
    with pytest.raises(ConfigError, match="is not a function"):
        Rewards.load(f"{name}:THRESHOLD")
    with pytest.raises(ConfigError, match="grpo.reward_weights has 1 weight"):
        Rewards.load([f"{name}:exact", f"{name}:length"], [1.0])


BROKEN = """
    def divides(prompts, completions, completion_ids, **kwargs):
        return [1 / int(c) for c in completions]

    def short(prompts, completions, completion_ids, **kwargs):
        return [1.0]

    def words(prompts, completions, completion_ids, **kwargs):
        return ["good" for c in completions]

    def nothing(prompts, completions, completion_ids, **kwargs):
        pass

    def no_kwargs(prompts, completions, completion_ids):
        return [1.0] * len(prompts)

    def solution(prompts, completions, completion_ids, solution, **kwargs):
        return [1.0] * len(prompts)

    def positional(prompts, completions, /, completion_ids, **kwargs):
        return [1.0] * len(prompts)
"""


def test_a_function_that_fails_names_itself_and_the_prompt(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = module(tmp_path, BROKEN)
    prompts = ["What is 1?", [{"role": "user", "content": "What is zero?"}], "What is 3?"]
    args = (prompts, ["1", "0", "3"], [[1], [0], [3]], {})
    with pytest.raises(RewardError) as error:
        Rewards.load(f"{name}:divides").score(*args)
    assert str(error.value) == (f"grpo.reward {name}:divides raised ZeroDivisionError: division by zero on the "
                                f"prompt 'What is zero?'")
    with pytest.raises(RewardError, match=f"{name}:short returned 1 rewards for 3 completions .*'What is 1\\?'"):
        Rewards.load(f"{name}:short").score(*args)
    with pytest.raises(RewardError, match=f"{name}:words returned 'good' for a completion of the prompt 'What is 1"):
        Rewards.load(f"{name}:words").score(*args)
    with pytest.raises(RewardError, match=f"{name}:nothing returned a value that is not a list for 3 completions "
                                          r"\(the first of the prompt 'What is 1\?'\)"):
        Rewards.load(f"{name}:nothing").score(*args)


def test_a_function_that_cannot_take_its_arguments_is_refused_before_the_run(tmp_path, monkeypatch):
    """Checked against the prompt rows' columns before anything is sampled (before: a TypeError at
    the first call, after compiling); TRL's signature, and one taking every column by name, pass."""
    monkeypatch.chdir(tmp_path)
    name = module(tmp_path, SCORES + BROKEN)
    Rewards.load([f"{name}:exact", f"{name}:length"]).check_arguments(["answer", "id"])
    Rewards.load(f"{name}:no_kwargs").check_arguments([])
    with pytest.raises(ConfigError) as error:
        Rewards.load([f"{name}:exact", f"{name}:no_kwargs"]).check_arguments(["answer"])
    assert str(error.value) == (f"grpo.reward={name}:no_kwargs cannot take the arguments it is called with: it takes "
                                f"no 'answer' (a column of the prompt rows, passed by name as TRL passes it): add "
                                f"**kwargs to its parameters")
    with pytest.raises(ConfigError) as error:
        Rewards.load(f"{name}:solution").check_arguments(["answer"])
    assert str(error.value) == (f"grpo.reward={name}:solution cannot take the arguments it is called with: its "
                                f"parameter 'solution' is given nothing (it gets prompts, completions, completion_ids "
                                f"and the prompt rows' columns by name: answer): give the rows a 'solution' field, or "
                                f"the parameter a default")
    with pytest.raises(ConfigError, match="its parameter 'prompts' is positional-only, and every argument is passed "
                                          "by name: drop the /$"):
        Rewards.load(f"{name}:positional").check_arguments([])
