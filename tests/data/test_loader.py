"""Batches are a pure function of (seed, position): deterministic, resumable, split across processes.

The token array is ``arange``, so a window's first token is its start offset.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from theseus.config import ConfigError
from theseus.data.loader import Loader, Windows

TOKENS = np.arange(5000, dtype=np.uint32)
SEQ = 16


def take(loader, n):
    return np.stack([next(loader) for _ in range(n)])


def test_batches_are_windows_of_seq_len_plus_one():
    batch = next(Loader(TOKENS, SEQ, 8, seed=0))
    assert batch.shape == (8, SEQ + 1) and batch.dtype == np.int32
    np.testing.assert_array_equal(batch, batch[:, :1] + np.arange(SEQ + 1))


def test_same_seed_same_batches_other_seed_other_batches():
    a, b, c = (take(Loader(TOKENS, SEQ, 8, seed=s), 40) for s in (0, 0, 1))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_an_epoch_visits_every_window_once():
    windows = Windows(TOKENS, SEQ, 1, seed=3)
    for epoch in range(3):
        starts = np.sort([windows.starts(epoch * windows.per_epoch + i)[0] for i in range(windows.per_epoch)])
        assert starts[0] < SEQ and starts[-1] + SEQ + 1 <= len(TOKENS)
        np.testing.assert_array_equal(starts, starts[0] + SEQ * np.arange(windows.per_epoch))
    assert windows.per_epoch == (len(TOKENS) - 1) // SEQ - 1


@pytest.mark.parametrize("n", [SEQ + 1, SEQ + 2, 2 * SEQ, 2 * SEQ + 1, 2 * SEQ + 2, 3 * SEQ + 7])
def test_windows_stay_inside_short_arrays(n):
    windows = Windows(np.arange(n), SEQ, 5, seed=0)
    starts = {int(s) for p in range(0, 2000, 5) for s in windows.batch(p)[:, 0]}
    assert max(starts) + SEQ + 1 <= n
    if n <= 2 * SEQ:  # one window per epoch: every start that fits is used
        assert starts == set(range(n - SEQ))


def test_next_follows_the_stream_whether_queued_or_gathered_inline():
    loader = Loader(TOKENS, SEQ, 4, seed=0, prefetch=2)
    for step in range(60):
        if step % 20 == 0:
            time.sleep(0.02)  # let the producer fill its queue
        np.testing.assert_array_equal(next(loader), loader.windows.batch(4 * step))
        assert loader.last_wait >= 0.0


def test_without_prefetch_no_thread_starts_and_the_stream_is_the_same():
    before = set(threading.enumerate())
    inline, threaded = Loader(TOKENS, SEQ, 4, seed=0, prefetch=0), Loader(TOKENS, SEQ, 4, seed=0)
    started = set(threading.enumerate()) - before
    assert [thread.name for thread in started] == ["theseus-data"]  # the threaded loader's producer only
    np.testing.assert_array_equal(take(inline, 30), take(threaded, 30))
    state = inline.get_state()
    inline.set_state(state)
    np.testing.assert_array_equal(take(inline, 5), take(threaded, 5))


def test_restored_state_continues_identically():
    loader = Loader(TOKENS, SEQ, 8, seed=5)
    take(loader, 350)  # past the end of the first epoch (311 windows)
    state = json.loads(json.dumps(loader.get_state()))
    assert state == {"split": "train", "seed": 5, "seq_len": SEQ, "position": 2800}
    expected = take(loader, 30)
    restored = Loader(TOKENS, SEQ, 8, seed=5)
    next(restored)
    restored.set_state(state)
    np.testing.assert_array_equal(take(restored, 30), expected)


def test_processes_split_each_global_batch_disjointly_and_completely():
    whole = take(Loader(TOKENS, SEQ, 8, seed=2), 50)
    parts = [take(Loader(TOKENS, SEQ, 4, seed=2, process_index=p, process_count=2), 50) for p in range(2)]
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), whole)
    starts = [set(part[:, :, 0].ravel().tolist()) for part in parts]
    assert not starts[0] & starts[1]
    assert len(starts[0]) + len(starts[1]) == 50 * 8  # 400 windows of a 311-window epoch, then the next


def test_state_carries_over_to_another_process_layout():
    single = Loader(TOKENS, SEQ, 8, seed=0)
    take(single, 7)
    state = single.get_state()
    expected = take(single, 5)
    parts = []
    for p in range(2):
        loader = Loader(TOKENS, SEQ, 4, seed=0, process_index=p, process_count=2)
        loader.set_state(state)
        parts.append(take(loader, 5))
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), expected)


def test_state_of_other_settings_is_refused():
    state = Loader(TOKENS, SEQ, 8, seed=0, split="val").get_state()
    with pytest.raises(ConfigError, match=r"^the saved data loader state has split='val' \(this loader: 'train'\), "
                                          r"seq_len=16 \(this loader: 32\): "
                                          r"resume with the data settings it was saved with$"):
        Loader(TOKENS, 32, 8, seed=0).set_state(state)


def test_close_stops_the_thread():
    loader = Loader(TOKENS, SEQ, 8, seed=0)
    next(loader)
    thread = loader._producer._thread
    loader.close()
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        next(loader)


def test_bad_arguments():
    with pytest.raises(ValueError, match="0 <= process_index < process_count"):
        Windows(TOKENS, SEQ, 8, seed=0, process_index=2, process_count=2)
    with pytest.raises(ValueError, match=r"^16 tokens cannot fill one window of seq_len \+ 1 = 17$"):
        Windows(TOKENS[:16], SEQ, 8, seed=0)
