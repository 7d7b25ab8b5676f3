"""The standard library's docstring chats: one question per documented public function or class."""

from __future__ import annotations

import sysconfig
from pathlib import Path

from theseus.data.corpus_files import stdlib_files
from theseus.data.docstring_chats import documented, stdlib_chats


def test_documented_takes_public_names_and_first_paragraphs(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('def f():\n    """First  line\n    goes on.\n\n    Second paragraph."""\n\n'
                      'def _hidden():\n    """Private."""\n\nclass C:\n    """A class."""\n\n'
                      'def bare():\n    pass\n')
    assert list(documented(source)) == [("f", "First line goes on."), ("C", "A class.")]
    (tmp_path / "broken.py").write_text("def (:\n")
    assert list(documented(tmp_path / "broken.py")) == []


def test_each_file_s_names_are_asked_about_under_its_module():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()[:20]
    expected = [(f"What does {'.'.join(path.relative_to(root).with_suffix('').parts).removesuffix('.__init__')}.{name} do?",
                 answer) for path in files for name, answer in documented(path)]
    found = [(c["messages"][0]["content"], c["messages"][1]["content"]) for c in stdlib_chats(20)]
    assert found == expected and len(found) > 20
    assert all(answer and "\n" not in answer for _, answer in found)
