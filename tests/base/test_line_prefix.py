"""Parallel jobs' lines: each line Python writes inside ``prefixed_output`` starts with the job."""

from __future__ import annotations

import io
import logging
import sys

from rich.console import Console

from theseus.base.line_prefix import prefixed_output


def test_every_line_inside_is_prefixed_and_the_streams_restored(monkeypatch):
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    handler = logging.StreamHandler(out)
    monkeypatch.setattr(logging.root, "handlers", [handler])
    with prefixed_output("[job 3] "):
        print("a\nb")
        print("c", end="")
        print(" d")
        print("e", file=sys.stderr)
        logging.getLogger("x").warning("logged")
        Console().print("rich line")
        assert not sys.stdout.isatty()
    print("after")
    assert sys.stdout is out and handler.stream is out
    assert out.getvalue() == "[job 3] a\n[job 3] b\n[job 3] c d\n[job 3] logged\n[job 3] rich line\nafter\n"
    assert err.getvalue() == "[job 3] e\n"
