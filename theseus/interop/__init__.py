"""Hugging Face checkpoints in and out: ``trainer.init_from=FOLDER`` and ``python -m theseus.export``.

hf_config: config.json <-> the ``architecture.*`` keys; hf_weights: safetensors tensors <-> the
param tree; loading: those tensors straight onto their shards; init_from: a composed config
resolved against the folder it names; expressible: whether a model is exactly what a
model_type computes (export writes nothing else).
"""
