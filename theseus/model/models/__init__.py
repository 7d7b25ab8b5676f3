"""Full models; importing this package registers them as options of the ``model`` group."""

from theseus.model.models.gpt import GPT
from theseus.model.models.moe_gpt import MoEGPT

__all__ = ["GPT", "MoEGPT"]
