"""Hugging Face checkpoints in and out (and GGUF files in): the formats' own readers and writers,
which ``theseus.sources`` (``trainer.init_from=SOURCE``) and ``python -m theseus.export`` use.

hf_config: config.json <-> the ``architecture.*`` keys; hf_weights: safetensors tensors <-> the
param tree; gguf: a GGUF file's config.json and tensors, by Hugging Face name; loading: tensors
by Hugging Face name straight onto their shards in theseus's layout; peft_adapter: LoRA's
adapters in peft's format; expressible: whether a model is exactly what a model_type computes
(export writes nothing else).
"""
