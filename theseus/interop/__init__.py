"""Hugging Face checkpoints in and out (and GGUF files in): ``trainer.init_from=SOURCE`` and
``python -m theseus.export``.

hf_config: config.json <-> the ``architecture.*`` keys; hf_weights: safetensors tensors <-> the
param tree; gguf: a GGUF file's config.json and tensors, by Hugging Face name; sources: each
model source's config, tensors and tokenizer; loading: those tensors straight onto their
shards; init_from: a composed config resolved against the model it names; expressible: whether
a model is exactly what a model_type computes (export writes nothing else).
"""
