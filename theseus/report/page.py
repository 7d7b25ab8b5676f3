"""The report as one self-contained HTML page: plotly.js, the page's script and style and
the runs' data all embedded, so it opens offline from a file or from the live server."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from theseus.report.data import document

REPORT = "report.html"
ASSETS = Path(__file__).parent


class ReportError(ValueError):
    """A path is neither a run directory nor a folder of runs."""


def collect(paths: Sequence[Path | str], empty_ok: bool = False) -> dict[str, Any]:
    """The report document of ``paths``; ReportError for a path that is missing or holds no run
    (``empty_ok``: a folder without runs yet, or not made yet, is fine)."""
    for path in map(Path, paths):
        if not path.exists() and not empty_ok:
            raise ReportError(f"{path} does not exist")
    try:
        return document(paths, empty_ok=empty_ok)
    except ValueError as exc:
        raise ReportError(str(exc)) from None


def html_page(data: dict[str, Any], live: bool = False) -> str:
    """The page for report document ``data``; ``live``: it polls ``data.json`` for updates."""
    from plotly.offline import get_plotlyjs  # plotly.js itself, ~4.5 MB, no network

    script = (ASSETS / "dashboard.js").read_text(encoding="utf-8")
    style = (ASSETS / "dashboard.css").read_text(encoding="utf-8")
    payload = json.dumps(data, allow_nan=False, default=str).replace("</", "<\\/")
    return (f"<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<title>theseus: {html.escape(data['title'])}</title><style>{style}</style>\n"
            f"<script>{get_plotlyjs()}</script></head><body>\n<div id=app></div>\n"
            f"<script>window.THESEUS = {{data: {payload}, live: {json.dumps(live)}}};</script>\n"
            f"<script>{script}</script>\n</body></html>\n")


def render(*paths: Path | str, output: Path | str | None = None) -> Path:
    """Write the report of ``paths``; to ``output``, else ``PATH/report.html`` for one path,
    else ``report.html`` in the working directory. Returns where it went."""
    data = collect(paths)
    out = Path(output) if output else Path(paths[0]) / REPORT if len(paths) == 1 else Path(REPORT)
    out.write_text(html_page(data), encoding="utf-8")
    return out
