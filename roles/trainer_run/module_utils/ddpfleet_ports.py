"""Binding a run's port on a host, for train.yml's preflight modules (the port probe on rank
0's host and the host check of every trainer), so both say the same of a port they cannot
have."""

from __future__ import annotations

import errno
import socket


def bind(port: int) -> tuple[socket.socket | None, str]:
    """A TCP socket bound to 0.0.0.0:port (SO_REUSEADDR: a port in TIME_WAIT is free), or
    None and why not: 'is busy' when a listener holds the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", int(port)))
    except OSError as exc:
        sock.close()
        return None, "is busy" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
    return sock, ""
