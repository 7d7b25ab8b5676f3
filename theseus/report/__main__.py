"""``python -m theseus.report PATH``: render a run directory or a sweep folder to PATH/report.html."""

from __future__ import annotations

import argparse
import sys

from theseus.report.page import ReportError, render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m theseus.report", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("path", help="a run directory (.hydra/, metrics.jsonl) or a sweep folder (0/, 1/, ...)")
    args = parser.parse_args(argv)
    try:
        print(render(args.path))
    except ReportError as exc:
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
