"""The live report: the page on localhost, its data re-read from the run directories on each
poll, so growing ``metrics.jsonl`` files and new sweep jobs show without a reload.
Bound to 127.0.0.1 only; nothing is sent anywhere else."""

from __future__ import annotations

import json
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from theseus.report.page import ReportError, collect, html_page

HOST = "127.0.0.1"


def server(paths: Sequence[Path | str], port: int = 0) -> ThreadingHTTPServer:
    """A server of the report of ``paths`` (``/`` the page, ``/data.json`` its data); port 0
    picks a free one (``server.server_address``). A folder without runs yet, or not made yet (a
    sweep just launched), is served as it fills; a file is a ReportError before serving. A
    browser that goes away mid-answer (a reload, a closed tab) is no error."""
    for path in map(Path, paths):
        if path.is_file():
            raise ReportError(f"{path} is a file, not a run directory or a folder of runs")
    collect(paths, empty_ok=True)  # a bad path fails here, once, not on every poll

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server name)
            route = self.path.split("?", 1)[0]
            if route not in ("/", "/data.json"):
                self.send_error(404)
                return
            try:
                data = collect(paths, empty_ok=True)
            except ReportError as exc:  # runs deleted while serving
                self.send_error(410, str(exc))
                return
            body = (html_page(data, live=True) if route == "/" else json.dumps(data, default=str)).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8" if route == "/" else "application/json")
                self.send_header("Cache-Control", "no-store")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except ConnectionError:  # BrokenPipeError, ConnectionResetError: the browser left
                self.close_connection = True

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (the http.server name)
            pass  # every poll would print a line

    return ThreadingHTTPServer((HOST, port), Handler)
