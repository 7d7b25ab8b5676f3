"""The report: finished (and running) runs read as data, and shown.

    records.py   a run directory as a ``RunRecord``, several as ``Runs`` (public as ``theseus.runs``)
    seeds.py     seed groups: mean, confidence interval, Welch's test of the best against the others
    data.py, page.py, serve.py   runs and sweeps overlaid in one interactive, self-contained HTML
                 page (charts drawn in the browser by plotly.js, embedded)

    python -m theseus.report PATH [PATH ...]     # writes PATH/report.html (several: ./report.html)
    python -m theseus.report PATH --serve        # live on http://127.0.0.1:8050/

Above ``training/`` (it reads what a job writes, ``theseus.training.run_files``); the command
is ``theseus.cli.report``.
"""
