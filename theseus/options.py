"""theseus's own options of every config group, each declared by where its class lives.

Declared in pyproject.toml as the ``theseus`` entry point of the group ``theseus.modules``, so
that discovery (``theseus.config.discovery``) loads it the way it loads a user's package.
Importing this module imports no option: each is imported when a config chooses it.
"""

from theseus.config.registry import declare

# in the order that --help lists the groups; the first of a group is its default where a config names none
declare("model", "gpt", "theseus.model.models.gpt:GPT")
declare("model", "moe", "theseus.model.models.moe_gpt:MoEGPT")
declare("task", "lm", "theseus.tasks.lm:LanguageModeling")
declare("task", "regression", "theseus.tasks.regression:PMMRegression")
declare("task", "sft", "theseus.tasks.sft:SupervisedFineTuning")
declare("task", "dpo", "theseus.tasks.dpo:DirectPreference")
declare("task", "grpo", "theseus.tasks.grpo:GroupRelativePolicyOptimization")
declare("optimizer", "adamw", "theseus.training.optimizer:AdamW")
declare("optimizer", "lion", "theseus.training.optimizer:Lion")
declare("optimizer", "adafactor", "theseus.training.optimizer:Adafactor")
declare("optimizer", "sgd", "theseus.training.optimizer:SGD")
declare("optimizer", "muon", "theseus.training.optimizer:Muon")
declare("data", "default", "theseus.data.config:DataConfig")
declare("trainer", "default", "theseus.training.config:TrainerConfig")
declare("mesh", "default", "theseus.base.mesh:MeshConfig")
declare("distributed", "default", "theseus.base.distributed:DistributedConfig")
declare("logger", "wandb", "theseus.training.logger:LoggerConfig")
declare("evaluation", "default", "theseus.evaluation.evaluations:EvaluationConfig")
