"""The batch loader: windows of ``seq_len + 1`` tokens, reshuffled each epoch, split across processes.

Epoch ``e`` cuts the token array into windows at ``offset_e + seq_len * k`` (stride ``seq_len``:
together they predict every token once) and visits them in the order ``perm_e``; both are drawn
from ``(seed, e)``. The global stream of windows is epoch 0's, then epoch 1's, and so on; each
step takes the next ``batch_size * process_count`` of them and process ``p`` the ``p``-th run of
``batch_size``. A batch is thus a pure function of (seed, position in the stream): the loader's
whole state is that position, and a restored loader repeats exactly the batches it would have
produced. A background thread gathers batches ahead from the memory-mapped tokens; should it
fall behind, ``next()`` gathers the batch itself, so no wait exceeds one gather (microseconds).
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from theseus.config import ConfigError

POLL = 0.005  # seconds a producer with prefetch batches ready sleeps before looking again


class Windows:
    """The batches of one process: ``batch(position) -> int32 [batch_size, seq_len + 1]``."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int,
                 process_index: int = 0, process_count: int = 1):
        if seq_len < 1 or batch_size < 1 or not 0 <= process_index < process_count:
            raise ValueError(f"need seq_len >= 1, batch_size >= 1 and 0 <= process_index < process_count, got "
                             f"{seq_len}, {batch_size}, {process_index}, {process_count}")
        if len(tokens) < seq_len + 1:
            raise ValueError(f"{len(tokens)} tokens cannot fill one window of seq_len + 1 = {seq_len + 1}")
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.stride = batch_size * process_count  # windows consumed per step, all processes together
        self.first = batch_size * process_index  # this process's first window within a step
        # windows per epoch; every offset in [0, max_offset] leaves room for all of them
        self.per_epoch = max(1, (len(tokens) - 1) // seq_len - 1)
        self.max_offset = min(seq_len - 1, len(tokens) - 1 - self.per_epoch * seq_len)
        self._epochs: dict[int, np.ndarray] = {}
        self._rows = np.lib.stride_tricks.sliding_window_view(tokens, seq_len + 1)  # a view: no copy

    def epoch_starts(self, epoch: int) -> np.ndarray:
        """The start of every window of ``epoch``, in the order the epoch visits them."""
        rng = np.random.default_rng((self.seed, epoch))
        offset = rng.integers(self.max_offset + 1)
        return offset + self.seq_len * rng.permutation(self.per_epoch)

    def starts(self, position: int) -> np.ndarray:
        """Token offsets of this process's windows in the step beginning at stream ``position``."""
        return self.starts_of(position + self.first + np.arange(self.batch_size))

    def starts_of(self, index: np.ndarray) -> np.ndarray:
        """Token offsets of the windows at stream positions ``index`` (non-decreasing, non-empty)."""
        epochs, within = np.divmod(index, self.per_epoch)
        first, last = int(epochs[0]), int(epochs[-1])
        cached = self._epochs  # read and written once: the producer and the consumer may both gather
        in_use = {e: cached[e] if e in cached else self.epoch_starts(e) for e in range(first, last + 1)}
        self._epochs = in_use
        if first == last:
            return in_use[first][within]
        return np.concatenate([starts[within[epochs == e]] for e, starts in in_use.items()])

    def batch(self, position: int) -> np.ndarray:
        return self._rows[self.starts(position)].astype(np.int32)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """The windows at stream positions ``index``: int32 ``[len(index), seq_len + 1]``."""
        return self._rows[self.starts_of(index)].astype(np.int32)

    def identity(self) -> dict:
        """What a saved position means only together with: the loader state's other entries."""
        return {"seed": self.seed, "seq_len": self.seq_len}


class Loader:
    """An endless iterator of batches (int32 ``[batch_size, seq_len + 1]``) with resumable state.

    A thread gathers up to ``prefetch`` batches ahead; with ``prefetch=0`` each batch is
    gathered by ``next()`` itself (microseconds), which suits a CPU backend, whose cores also
    run the steps. ``last_wait`` is how long the latest ``next()`` blocked for data, in seconds.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int,
                 process_index: int = 0, process_count: int = 1, *, split: str = "train", prefetch: int = 8):
        self._begin(Windows(tokens, seq_len, batch_size, seed, process_index, process_count), split, prefetch)

    @classmethod
    def over(cls, windows, *, split: str = "train", prefetch: int = 8) -> Loader:
        """A loader of any ``windows`` with ``Windows``'s ``batch``, ``stride`` and ``identity``
        (a mixture's, say): the same thread, state and resume."""
        loader = cls.__new__(cls)
        loader._begin(windows, split, prefetch)
        return loader

    def _begin(self, windows, split: str, prefetch: int) -> None:
        self.windows, self.split, self.prefetch = windows, split, prefetch
        self.last_wait = 0.0
        self._start(0)

    def __iter__(self) -> Loader:
        return self

    def __next__(self) -> np.ndarray:
        if not self._finalizer.alive:
            raise RuntimeError("this data loader is closed")
        began = time.perf_counter()
        batch = self._producer.take(self._position)
        self.last_wait = time.perf_counter() - began
        self._position += self.windows.stride
        return batch

    def get_state(self) -> dict:
        """JSON-serialisable; the same on every process."""
        return {"split": self.split, **self.windows.identity(), "position": self._position}

    def set_state(self, state: dict) -> None:
        """Continue from ``state`` (from ``get_state``, possibly of another process or batch size)."""
        mine = self.get_state()
        differ = [f"{key}={state.get(key)!r} (this loader: {mine[key]!r})" for key in mine
                  if key != "position" and state.get(key) != mine[key]]
        if differ:
            raise ConfigError(f"the saved data loader state has {', '.join(differ)}: "
                              "resume with the data settings it was saved with")
        self.close()
        self._start(int(state["position"]))

    def close(self) -> None:
        """Stop the background thread (also done when the loader is garbage-collected)."""
        self._finalizer()

    def _start(self, position: int) -> None:
        self._position = position
        self._producer = _Producer(self.windows, position, self.prefetch) if self.prefetch else _Inline(self.windows)
        self._finalizer = weakref.finalize(self, self._producer.stop)


def stack(examples: Sequence[Any]) -> Any:
    """Examples (arrays, or dicts of arrays: a task's pytree) stacked on a new leading batch axis."""
    if isinstance(examples[0], Mapping):
        return {key: np.stack([example[key] for example in examples]) for key in examples[0]}
    return np.stack(examples)


def in_batches(rows: Sequence[int], example: Callable[[int], Any], empty: Any, batch_size: int,
               process_index: int = 0, process_count: int = 1) -> Iterator[tuple[Any, Sequence[int]]]:
    """Every one of ``rows`` once, in order: ``(batch, held)`` per global batch of ``batch_size``
    examples (``example(row)``; the last batch padded with ``empty``), ``batch`` this process's
    share of it (``stack``ed), ``held`` the rows of the whole global batch."""
    share = batch_size // process_count
    for start in range(0, len(rows), batch_size):
        held = rows[start:start + batch_size]
        mine = range(process_index * share, (process_index + 1) * share)
        yield stack([example(held[i]) if i < len(held) else empty for i in mine]), held


class _Inline:
    """No thread: ``take`` gathers the batch on the caller's thread."""

    def __init__(self, windows: Windows):
        self.take = windows.batch

    def stop(self) -> None:
        pass


class _Producer:
    """A thread gathering the batches from ``position`` on, up to ``prefetch`` ahead.

    ``take(position)`` returns the ready batch for ``position``, or gathers it on the caller's
    thread when the producer has fallen behind (a CPU-starved thread, a contended GIL): a wait
    never exceeds one gather. The producer then skips ahead to the consumer. The consumer takes
    no lock (a deque's append and popleft are atomic), so a descheduled producer cannot block it.
    """

    def __init__(self, windows: Windows, position: int, prefetch: int):
        self.windows = windows
        self.prefetch = prefetch
        self.wanted = position  # the consumer's position; the thread never gathers below it
        self.ready: collections.deque[tuple[int, np.ndarray | BaseException]] = collections.deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(position,), daemon=True, name="theseus-data")
        self._thread.start()

    def take(self, position: int) -> np.ndarray:
        self.wanted = position
        while self.ready:
            at, item = self.ready.popleft()
            if isinstance(item, BaseException):
                raise item
            if at == position:
                return item  # anything before it was gathered here already: dropped
        return self.windows.batch(position)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self, position: int) -> None:
        try:
            while not self._stop.is_set():
                if len(self.ready) >= self.prefetch:
                    self._stop.wait(POLL)
                    continue
                position = max(position, self.wanted)
                self.ready.append((position, self.windows.batch(position)))
                position += self.windows.stride
        except BaseException as exc:  # handed to the consumer, raised by its next()
            self.ready.append((position, exc))
