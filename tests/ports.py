"""Loopback ports for the servers a test starts itself (private services, receivers, daemons'
metrics endpoints, forwarders).

Not port 0's pick: the kernel takes that from the ephemeral range (``ip_local_port_range``),
the same range every outgoing connection's source port comes from, so between the probe and
the server's own bind a connection to PostgreSQL or RabbitMQ may take the port, and the
server fails to start. Ports below that range are never handed out to outgoing
connections. Each pytest-xdist worker (``PYTEST_XDIST_WORKER``: gw0, gw1, ...) draws from
a slice of its own, so two workers of one run never pick the same port; within a slice a
port is checked free by binding it, and not handed out again by one process soon after.
Runs beside each other on one machine (each with its own ``QUEUE_PREFIX``) mostly draw
from different blocks of slices: a port checked free by one could be taken by the other
before its server binds it.

A system started the way ``make run`` starts it listens on PORT and on PORT + 100, 200, ...
500 (honcho's ports, one a Procfile line): ``free_port_with`` finds a PORT whose every
such port is in this worker's slice too, so that no other worker draws one of them while
the system starts. A slice is wide enough for that.
"""

from __future__ import annotations

import os
import random
import re
import socket
import threading
import zlib
from collections import deque
from collections.abc import Iterable

HOST = "127.0.0.1"
# 20000-29599: under Linux's default ephemeral range (32768-60999), above the well-known
# services' ports the machine runs (PostgreSQL, RabbitMQ, Redis, Erlang's epmd). Two blocks
# (one a run) of eight slices (one a worker) of 600 ports: a ``make run`` system's ports
# (PORT to PORT + 500) fit in one slice.
FIRST_PORT = 20000
SLICE = 600
SLICES_PER_BLOCK = 8
BLOCKS = 2

_lock = threading.Lock()
# The ports handed out lately: not again while their servers may still be starting. Bounded,
# so that a long session walks its slice round and round.
_handed_out: deque[int] = deque(maxlen=SLICE // 2)


def worker_slot() -> int:
    """0 outside xdist (one process), 1 + N for worker gwN."""
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return 1 + int(match.group(1)) if match else 0


def run_block() -> int:
    """This run's block of slices, from the names it keeps apart from other runs'."""
    names = os.environ.get("QUEUE_PREFIX", "") + os.environ.get("DATABASE_URL", "")
    return zlib.crc32(names.encode()) % BLOCKS


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on, from this worker's slice."""
    return free_port_with((0,))


def free_port_with(offsets: Iterable[int]) -> int:
    """A port P of this worker's slice with P + each offset free and in the slice too; none
    of them is handed out again by this process soon after."""
    offsets = sorted(set(offsets))
    block = run_block() * SLICES_PER_BLOCK
    start = FIRST_PORT + (block + worker_slot() % SLICES_PER_BLOCK) * SLICE
    room = SLICE - offsets[-1]
    # A random place to begin: another run on the machine (its own gw0) walks the same
    # slice, and rarely from the same place.
    first = random.randrange(room)
    with _lock:
        for step in range(room):
            port = start + (first + step) % room
            wanted = [port + offset for offset in offsets]
            if any(p in _handed_out or not _bindable(p) for p in wanted):
                continue
            _handed_out.extend(wanted)
            return port
    raise RuntimeError(
        f"no loopback port in {start}-{start + SLICE - 1} with {offsets} free beside it"
    )
