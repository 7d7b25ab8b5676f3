"""Rendering a run directory or a sweep folder as one HTML page (read by ``theseus.training.runs``).

    python -m theseus.report PATH       # writes PATH/report.html
"""
