"""The report: runs and sweeps overlaid in one interactive, self-contained HTML page (read by
``theseus.training.records``; charts drawn in the browser by plotly.js, embedded).

    python -m theseus.report PATH [PATH ...]     # writes PATH/report.html (several: ./report.html)
    python -m theseus.report PATH --serve        # live on http://127.0.0.1:8050/
"""
