"""``fetched``: a loop's programs reach the host in order, never more than ``IN_FLIGHT`` of them
dispatched and not yet fetched (past XLA's CPU client's 32 a device, several CPU devices deadlock:
theseus.base.dispatch)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from theseus.base.dispatch import IN_FLIGHT, fetched


def test_at_most_in_flight_results_are_dispatched_ahead_and_each_arrives_on_the_host_in_order():
    drawn: list[int] = []

    def dispatched():  # each result "dispatched" as it is drawn
        for i in range(3 * IN_FLIGHT + 2):
            drawn.append(i)
            yield {"value": jnp.full((2,), i, jnp.float32), "count": i}

    arrived, ahead = [], []
    for result in fetched(dispatched()):
        ahead.append(len(drawn) - len(arrived))  # dispatched and not fetched, this one included
        arrived.append(result)
    assert max(ahead) == IN_FLIGHT and min(ahead) == 1  # as far ahead as allowed, then drained
    assert [result["count"] for result in arrived] == list(range(3 * IN_FLIGHT + 2))
    assert all(type(result["value"]) is np.ndarray and result["value"][0] == result["count"] for result in arrived)
    assert list(fetched([])) == []
