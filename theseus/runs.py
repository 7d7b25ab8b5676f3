"""Runs as data, for a notebook: a run's (or a sweep's, or several) config and metrics.

    import theseus.runs
    runs = theseus.runs.load("multirun/2026-12-02/10-00-00")   # a sweep folder, run directories, ...
    runs.metrics()            # every logged row: {"run": "optimizer.lr=0.001", "optimizer.lr": 0.001, "step": 10, "loss": ...}
    runs.summary()            # one row per run: status, step of max_steps, ETA, differing keys, last metrics
    runs.dataframe()          # metrics() as a pandas DataFrame (pandas installed)
    runs[0].config, runs[0].series("val_loss")   # a RunRecord

The implementation is the report's (``theseus.report.records``, ``theseus.report.seeds``).
"""

from __future__ import annotations

from theseus.report.records import RunRecord, Runs, load
from theseus.report.seeds import Group, seed_groups

__all__ = ["Group", "RunRecord", "Runs", "load", "seed_groups"]
