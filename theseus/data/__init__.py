"""Data: corpus sources, tokenizers, preparation into token shards, the batch loader.

    from theseus.data.dataset import open_dataset
    ds = open_dataset(configure(DataConfig))   # prepares on first use
"""
