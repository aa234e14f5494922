"""Ports for the servers the tests start, and addresses where nothing listens.

A port asked of the kernel (bound to 0) and closed again is free for anyone until it is
used: under pytest-xdist another worker's server, bound to 0 a moment later, may get it,
and a bot.py that must refuse to start then finds someone listening on its port. Each
worker draws from its own slice of the ports below the kernel's ephemeral range (which
bind-to-0 never hands out), in turn, so neither another worker nor a server bound to 0
can take a port between the draw and its use.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

_LOWEST = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _slice() -> range:
    """This worker's ports: gw0 the first slice of PYTEST_XDIST_WORKER_COUNT, a plain run all."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    size = (_ephemeral_low() - _LOWEST) // max(count, 1)
    return range(_LOWEST + index * size, _LOWEST + (index + 1) * size)


_PORTS = _slice()
_NEXT = itertools.count(random.randrange(len(_PORTS)))


def free_port() -> int:
    """A port of this worker's slice that nothing listens on now; a new one each call."""
    for _ in range(len(_PORTS)):
        port = _PORTS[next(_NEXT) % len(_PORTS)]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_PORTS}")
