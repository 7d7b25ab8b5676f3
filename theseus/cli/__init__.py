"""The command layer: each command a user types, and what only the commands use.

    run.py (python -m theseus.run, train())   sample.py, conversation.py (--chat)   evaluate.py
    export.py   launch.py (local multi-process)   config.py (python -m theseus.config)
    report.py (python -m theseus.report)   prepare.py (python -m theseus.data.prepare)
    sweep.py (the sweep summary, a Hydra callback)   slurm.py (hydra/launcher=slurm's jobs)
    hydra_checks.py (a launcher's or sweeper's settings checked)   trained.py (a model source, loaded)
    command_exit.py (how a command's process ends)

The top floor: it imports any floor below (config -> base -> model -> stateful / data -> tasks /
evaluation -> training -> interop / plan / report -> recipe) and none imports it. The ``python -m``
paths users type (``theseus/run.py``, ``sample.py``, ``evaluate.py``, ``export.py``, ``launch.py``,
``config/__main__.py``, ``report/__main__.py``, the ``__main__`` block of ``data/prepare.py``) and
``theseus/__main__.py`` (the ``theseus`` script) are entries of this layer by definition: each only
imports its command from here and runs it.
"""
