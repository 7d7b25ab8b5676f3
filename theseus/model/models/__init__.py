"""Full models; importing this package registers them as options of the ``model`` group."""

from theseus.model.models.gpt import GPT, cross_entropy, load_hf_gpt2

__all__ = ["GPT", "cross_entropy", "load_hf_gpt2"]
