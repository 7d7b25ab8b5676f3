"""How far a loop of programs runs ahead of the devices: at most ``IN_FLIGHT`` dispatched and not fetched.

    metrics = list(fetched(step(params, batch) for batch in batches))   # host values, in order

JAX returns from a jitted call at once, so a loop over many batches queues every program before
the first has run. XLA's CPU client admits 32 programs a device in flight (a semaphore its
launcher threads wait on) and has as many launcher threads as cores, at least one a device: with
a device per core (a run's CPU default) and a program whose devices meet in a collective (a mean
over the batch's shards), the launchers can all wait on that semaphore while one device's part
of the oldest program waits for a launcher: the other devices wait in its all-reduce until XLA
aborts (``rendezvous ... may be stuck``, then ``Termination timeout``). A loop that dispatches
more than a few programs without reading their results (an evaluation of every pair of a file)
draws them through ``fetched``.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import TypeVar

import jax

IN_FLIGHT = 8  # programs dispatched ahead of the host, well under XLA's CPU client's 32 a device

T = TypeVar("T")


def fetched(results: Iterable[T]) -> Iterator[T]:
    """Each of ``results`` (a pytree of a program's outputs, the program dispatched as the iterable
    is drawn) on the host (``jax.device_get``), in order, drawing the next one only while fewer than
    ``IN_FLIGHT`` are dispatched and not yet fetched."""
    pending: collections.deque[T] = collections.deque()
    for result in results:
        pending.append(result)
        if len(pending) == IN_FLIGHT:
            yield jax.device_get(pending.popleft())
    while pending:
        yield jax.device_get(pending.popleft())
