"""Full models; importing this package registers them as options of the ``model`` group."""

from theseus.model.models.gpt import GPT, cross_entropy

__all__ = ["GPT", "cross_entropy"]
