"""Full models; importing this package registers them as options of the ``model`` group."""

from theseus.model.models.gpt import GPT, load_hf_gpt2

__all__ = ["GPT", "load_hf_gpt2"]
