"""The loopback ports the tests' servers take: each pytest-xdist worker draws from a slice of
its own, a ``make run`` system's ports (PORT to PORT + 500) included."""

from __future__ import annotations

import pytest

from tests import ports

SYSTEM = range(0, 600, 100)  # make run's: the API, four daemons, the live streams


def slice_of(port: int) -> int:
    return (port - ports.FIRST_PORT) // ports.SLICE


# The workers of one run (``-n 8`` at most: one slice each).
WORKERS = [f"gw{number}" for number in range(ports.SLICES_PER_BLOCK)]


@pytest.mark.parametrize("worker", ["gw0", "gw3", "gw7"])
def test_a_systems_ports_are_all_in_the_slice_of_the_worker_that_starts_it(monkeypatch, worker):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    base = ports.free_port_with(SYSTEM)
    taken = {base + offset for offset in SYSTEM}

    assert {slice_of(port) for port in taken} == {slice_of(base)}
    assert max(taken) < 32768, "below the ephemeral range"
    # This worker does not hand them out again soon after (its next hundred ports), and
    # every other worker of the run draws from a slice of its own.
    again = {ports.free_port() for _ in range(100)}
    assert not again & taken, sorted(again & taken)
    for other in WORKERS:
        if other != worker:
            monkeypatch.setenv("PYTEST_XDIST_WORKER", other)
            assert slice_of(base) not in {slice_of(ports.free_port()) for _ in range(20)}
