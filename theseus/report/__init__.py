"""Reading run and sweep folders, and rendering them as one HTML page.

    python -m theseus.report PATH       # writes PATH/report.html

Kept free of heavy imports: ``theseus.sweep`` reads runs through ``rundir`` inside every job.
"""
