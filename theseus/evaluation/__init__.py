"""Evaluation: what a run's evaluations and ``python -m theseus.evaluate`` measure.

    evaluations.py      EvaluationConfig (``evaluation.*``), load_evaluations, evaluate: the validation
                        loss (per mixture source too) and the tasks below, on the run's mesh
    multiple_choice.py  ``evaluation.multiple_choice``: local JSONL tasks scored as lm-eval scores them
    harness.py          ``evaluation.lm_eval``: lm-evaluation-harness tasks (optional: ``theseus[eval]``)

Beside ``tasks/`` on one floor (neither imports the other): a task is what is optimised, an
evaluation what is measured; ``training/`` imports both.
"""
