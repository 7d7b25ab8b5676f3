"""``python -m theseus.report PATH [PATH ...]``: overlay runs and sweeps in one interactive HTML
page (PATH/report.html for one path, else report.html here); ``--serve`` shows it live on localhost."""

from __future__ import annotations

import argparse
import sys

from theseus.report.page import ReportError, render
from theseus.report.serve import server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m theseus.report", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a run directory (.hydra/, metrics.jsonl), a sweep folder (0/, 1/, ...) or a folder of runs")
    parser.add_argument("-o", "--output", help="where to write the page (default: PATH/report.html, or ./report.html)")
    parser.add_argument("--serve", action="store_true", help="serve the page on localhost, updated as the runs grow")
    parser.add_argument("--port", type=int, default=8050, help="the --serve port (default 8050; 0: any free one)")
    args = parser.parse_args(argv)
    try:
        if not args.serve:
            print(render(*args.paths, output=args.output))
            return 0
        httpd = server(args.paths, args.port)
    except ReportError as exc:
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the port is taken
        print(f"theseus: error: cannot serve on port {args.port}: {exc.strerror}; pick another with --port", file=sys.stderr)
        return 2
    host, port = httpd.server_address[:2]
    print(f"serving the report on http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
