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
"""

from __future__ import annotations

import os
import random
import re
import socket
import threading
import zlib
from collections import deque

HOST = "127.0.0.1"
# 20000-31999: under Linux's default ephemeral range (32768-60999), above the well-known
# services' ports the machine runs (PostgreSQL, RabbitMQ, Redis, Erlang's epmd). Six blocks
# (one a run) of eight slices (one a worker) of 250 ports.
FIRST_PORT = 20000
SLICE = 250
SLICES_PER_BLOCK = 8
BLOCKS = 6

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
    block = run_block() * SLICES_PER_BLOCK
    start = FIRST_PORT + (block + worker_slot() % SLICES_PER_BLOCK) * SLICE
    # A random place to begin: another run on the machine (its own gw0) walks the same
    # slice, and rarely from the same place.
    offset = random.randrange(SLICE)
    with _lock:
        for step in range(SLICE):
            port = start + (offset + step) % SLICE
            if port in _handed_out or not _bindable(port):
                continue
            _handed_out.append(port)
            return port
    raise RuntimeError(f"no free loopback port in {start}-{start + SLICE - 1}")
