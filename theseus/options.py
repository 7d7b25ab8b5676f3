"""theseus's own options of every config group: importing this module registers them.

Declared in pyproject.toml as the ``theseus`` entry point of the group ``theseus.modules``, so
that discovery (``theseus.config.discovery``) loads it the way it loads a user's package.
"""

# in the order that --help lists the groups
import theseus.model.models  # noqa: F401  model=gpt
import theseus.tasks  # noqa: F401  task=lm, task=regression  # isort: skip
import theseus.training.optimizer  # noqa: F401  optimizer=adamw  # isort: skip
import theseus.data.config  # noqa: F401  data=default  # isort: skip
import theseus.training.config  # noqa: F401  trainer=default  # isort: skip
import theseus.base.mesh  # noqa: F401  mesh=default  # isort: skip
import theseus.base.distributed  # noqa: F401  distributed=default  # isort: skip
import theseus.training.logger  # noqa: F401  logger=wandb  # isort: skip
import theseus.tasks.evaluation  # noqa: F401  evaluation=default  # isort: skip
