"""Tasks: what a job optimises (``task=NAME``); importing this package registers theseus's own.

    from theseus.tasks import LossTask, register   # a user's task: @register("task", "NAME")
"""

from theseus.tasks.lm import LanguageModeling, cross_entropy
from theseus.tasks.regression import PMMRegression
from theseus.tasks.task import JobTask, LossTask, Task, task_class

__all__ = ["JobTask", "LanguageModeling", "LossTask", "PMMRegression", "Task", "cross_entropy",
           "task_class"]
