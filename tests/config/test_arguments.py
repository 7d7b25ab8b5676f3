"""The commands' own arguments as a user meets them: help as plain text, a misspelt option told
the one it resembles."""

from __future__ import annotations

import importlib

import pytest

from theseus.__main__ import COMMANDS, main
from theseus.config.arguments import Parser, did_you_mean


def test_theseus_help_is_plain_text(capsys):
    assert main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("theseus COMMAND [ARGS] (or python -m theseus COMMAND): one command for every entry point.")
    assert 'shell completion works for theseus run: eval "$(theseus -sc install=bash)".' in shown
    assert "`" not in shown


@pytest.mark.parametrize("command", ["sample", "export", "evaluate", "launch", "report"])
def test_each_command_s_help_is_plain_text(command, capsys):
    with pytest.raises(SystemExit) as exit:
        importlib.import_module(COMMANDS[command]).main(["--help"])
    shown = capsys.readouterr().out
    assert exit.value.code == 0 and f"usage: python -m theseus.{command}" in shown
    assert "`" not in shown, shown


@pytest.mark.parametrize("unknown, says", [
    (["--max_new_tokens", "24"], "; did you mean --max-new-tokens?"),  # an underscore for a dash
    (["--max_new_tokens=24"], "; did you mean --max-new-tokens?"),
    (["--temprature", "1"], "; did you mean --temperature?"),
    (["--num-fewshot", "0"], "; did you mean --num_fewshot?"),  # a dash for an underscore
    (["24", "--stepp"], "; did you mean --step?"),  # the first option among them
    (["--stop"], ""),  # too far from any (--step, --top-k)
    (["temperature"], ""),  # not an option
])
def test_an_unknown_option_is_told_the_one_it_resembles(unknown, says):
    options = ["-h", "--help", "--max-new-tokens", "--temperature", "--top-k", "--num_fewshot", "--step"]
    assert did_you_mean(unknown, options) == says


def test_the_parser_refuses_an_unknown_option_in_one_line(capsys):
    parser = Parser(prog="python -m tool", description="``python -m tool``: a tool.")
    parser.add_argument("--max-new-tokens", type=int)
    assert "python -m tool: a tool." in parser.format_help()
    with pytest.raises(SystemExit) as exit:
        parser.parse_args(["--max_new_tokens", "3"])
    assert exit.value.code == 2
    assert capsys.readouterr().err == ("theseus: error: unrecognized arguments: --max_new_tokens 3; did you mean "
                                       "--max-new-tokens? (usage: python -m tool --help)\n")
    with pytest.raises(SystemExit):
        parser.parse_intermixed_args(["--max-new-token", "3", "--stepp"])  # an abbreviation argparse takes
    assert capsys.readouterr().err.startswith("theseus: error: unrecognized arguments: --stepp (usage:")
