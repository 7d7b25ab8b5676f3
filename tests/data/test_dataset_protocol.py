"""The five kinds of a task's data are ``Dataset``s: each draws its examples through the
protocol's ``loader``; the two an evaluation scores whole are ``WholeValidation``s."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from theseus.data.chat import ChatTemplate
from theseus.data.conversations import Conversations
from theseus.data.dataset import TokenDataset
from theseus.data.dataset_protocol import Dataset, WholeValidation
from theseus.data.mixture import Mixture
from theseus.data.preferences import Preferences, encode_pair
from theseus.data.prompts import Prompts, prompt_ids
from theseus.data.shards import ShardMeta
from theseus.data.tokenizer import ByteTokenizer

SEQ = 48
TOKENIZER = ByteTokenizer()


def tokens() -> TokenDataset:
    meta = ShardMeta("uint16", TOKENIZER.vocab_size, "byte", {"train": 200, "val": 100})
    rng = np.random.default_rng(0)
    return TokenDataset(Path("corpus"), meta, TOKENIZER, {split: rng.integers(0, 257, n).astype(np.uint16)
                                                          for split, n in meta.counts.items()})


def conversations() -> Conversations:
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(8)]
    return Conversations.encode(rows, ChatTemplate.find("byte"), TOKENIZER, val_fraction=0.25)


def preferences() -> Preferences:
    pairs = [encode_pair(TOKENIZER, f"p{i} ", "yes", "no", None) for i in range(8)]
    return Preferences(TOKENIZER, pairs, {"train": list(range(6)), "val": [6, 7]}, reference_free=True)


def prompts() -> Prompts:
    texts = [f"prompt {i}" for i in range(8)]
    return Prompts(TOKENIZER, [{"prompt": text} for text in texts], [prompt_ids(TOKENIZER, None, t) for t in texts],
                   {"train": list(range(6)), "val": [6, 7]}, stop_tokens=(0,), num_generations=2, completion_length=4)


KINDS = {"tokens": tokens, "mixture": lambda: Mixture({"a": tokens(), "b": tokens()}, {"a": 1.0, "b": 3.0}),
         "conversations": conversations, "preferences": preferences, "prompts": prompts}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_a_dataset_and_loads_through_the_protocol(kind):
    dataset = KINDS[kind]()
    assert isinstance(dataset, Dataset)
    assert dataset.vocab_size == dataset.tokenizer.vocab_size == TOKENIZER.vocab_size
    loader = dataset.loader("train", SEQ, 4, seed=0, process_index=0, process_count=1, prefetch=0)
    batch = next(loader)
    loader.close()
    leading = {leaf.shape[0] for leaf in (batch.values() if isinstance(batch, dict) else [batch])}
    assert leading == ({4 // 2} if kind == "prompts" else {4})  # prompts: batch_size counts completions


@pytest.mark.parametrize("kind", KINDS)
def test_the_loaders_take_the_protocols_parameters(kind):
    ours = inspect.signature(type(KINDS[kind]()).loader).parameters
    assert list(ours) == list(inspect.signature(Dataset.loader).parameters)


def test_conversations_and_pairs_are_scored_whole_and_token_windows_by_batches():
    whole = {kind for kind, make in KINDS.items() if isinstance(make(), WholeValidation)}
    assert whole == {"conversations", "preferences"}


def test_a_class_without_a_loader_is_not_a_dataset():
    class Tokens:
        tokenizer, vocab_size, bytes_per_token = TOKENIZER, TOKENIZER.vocab_size, None

    assert not isinstance(Tokens(), Dataset)
