"""Tasks: what a job optimises (``task=NAME``); theseus's own are declared in ``theseus.options``.

    from theseus.tasks import LossTask, register   # a user's task: @register("task", "NAME")

The ``regression`` task (``theseus.tasks.regression``) is not imported here: it is built on
the stateful API, which a language-model run never imports.
"""

from theseus.config import register
from theseus.tasks.lm import LanguageModeling, cross_entropy
from theseus.tasks.task import JobTask, LossTask, Task, task_class

__all__ = ["JobTask", "LanguageModeling", "LossTask", "Task", "cross_entropy", "register", "task_class"]
