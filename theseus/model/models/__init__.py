"""Full models; importing this package registers them as options of the ``model`` group."""

from theseus.model.models.gpt import GPT

__all__ = ["GPT"]
