"""``python -m theseus.report PATH [PATH ...]``: overlay runs and sweeps in one interactive HTML
page (PATH/report.html for one path, else report.html here); ``--serve`` shows it live on localhost."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from theseus.config.arguments import PORT, Parser
from theseus.report.page import ReportError, render
from theseus.report.records import run_paths
from theseus.report.serve import server

DEFAULT_PORT = 8050


def check_arguments(args: argparse.Namespace) -> None:
    """ReportError for options that contradict each other or a page that cannot be written, before any work."""
    if args.serve and args.output:
        raise ReportError("-o writes the page to a file, --serve serves it live and writes nothing: give one of them")
    if not args.serve and args.port is not None:
        raise ReportError(f"--port {args.port} is the port of --serve: add --serve, or drop --port")
    out = Path(args.output) if args.output else None
    if out is not None and out.is_dir():
        raise ReportError(f"-o {out} is a folder: give the page's file name (-o {out / 'report.html'})")
    if out is not None and not out.absolute().parent.is_dir():
        raise ReportError(f"-o {out}: its folder {out.absolute().parent} does not exist: create it or write elsewhere")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m theseus.report", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a run directory (.hydra/, metrics.jsonl), a sweep folder (0/, 1/, ...) or a folder of runs")
    parser.add_argument("-o", "--output", help="where to write the page (default: PATH/report.html, or ./report.html)")
    parser.add_argument("--serve", action="store_true", help="serve the page on localhost, updated as the runs grow")
    parser.add_argument("--port", type=PORT, default=None, help=f"the --serve port (default {DEFAULT_PORT}; 0: any free one)")
    args = parser.parse_args(argv)
    port = DEFAULT_PORT if args.port is None else args.port
    try:
        check_arguments(args)
        if not args.serve:
            print(render(*args.paths, output=args.output))
            return 0
        httpd = server(args.paths, port)
    except ReportError as exc:
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the port is taken or not this user's; the page's file not writable
        fix = f"cannot serve on port {port}: {exc.strerror}; pick another with --port" if args.serve else \
            f"cannot write {exc.filename}: {exc.strerror}; write elsewhere with -o FILE"
        print(f"theseus: error: {fix}", file=sys.stderr)
        return 2
    host, port = httpd.server_address[:2]
    print(f"serving the report on http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    for path in map(Path, args.paths):
        if not (path.is_dir() and run_paths(path)):
            made = "" if path.exists() else " (not made yet)"
            print(f"waiting for runs in {path}{made}: each shows as it starts", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0
