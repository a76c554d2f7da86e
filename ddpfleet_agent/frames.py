"""The agents' store's wire (store.py): a request and its answer are each one frame, a 4-byte
big-endian length and a JSON object. What the server reads from a client is bounded in time and
memory; what a client reads comes from the run's own store."""

from __future__ import annotations

import json
import socket
import threading
import time

MAX_FRAME = 4 << 20  # bytes of one request or answer (compare_set: two values of 1 MiB, base64)
# What a client holds of the serving agent. A connection silent for IDLE_S is closed: agents
# call every tick (0.5 s), and after a longer pause open a new one (store.StoreClient). A frame
# is received within FRAME_S of its first byte: an agent's is one sendall of ~100 KB at most.
# Frames up to SMALL are read freely (x store.MAX_CONNECTIONS = 32 MiB); the bytes of larger
# ones past SMALL, all connections together, stay within MAX_PENDING (the connection that would
# pass it is closed), held as they arrive: an agent's own frames never wait on that budget.
IDLE_S = 30.0
FRAME_S = 10.0
SMALL = 128 << 10
MAX_PENDING = 32 << 20
CHUNK = 64 << 10  # bytes read at a time


class Hangup(ConnectionError):
    """The store's side closed the connection before any of its answer."""


def send_frame(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(len(data).to_bytes(4, "big") + data)


def _exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("the store's connection closed") if buf else Hangup()
        buf += chunk
    return bytes(buf)


def _message(data: bytes) -> dict:
    try:
        message = json.loads(data)
    except Exception:  # bad JSON, bad UTF-8, too deep: not a frame, whatever it raised
        raise ConnectionError("a frame that is not JSON") from None
    if not isinstance(message, dict):
        raise ConnectionError("a frame that is not a JSON object")
    return message


def recv_frame(sock: socket.socket) -> dict:
    """An answer from the store (Hangup: the connection closed before it began)."""
    size = int.from_bytes(_exactly(sock, 4), "big")
    if size > MAX_FRAME:
        raise ConnectionError(f"a frame of {size} bytes (at most {MAX_FRAME})")
    return _message(_exactly(sock, size))


class Budget:
    """Bytes of large frames being received, all connections together (MAX_PENDING)."""

    def __init__(self) -> None:
        self.held, self.lock = 0, threading.Lock()

    def take(self, size: int) -> None:
        """``size`` bytes more held (negative: given back); ConnectionError past MAX_PENDING."""
        with self.lock:
            if size > 0 and self.held + size > MAX_PENDING:
                raise ConnectionError("too many bytes of frames being received")
            self.held += size


def receive(sock: socket.socket, budget: Budget) -> dict:
    """A client's request: its first byte within IDLE_S, the rest as it arrives within FRAME_S
    of that (no buffer sized by the announced length). ConnectionError or TimeoutError else."""
    sock.settimeout(IDLE_S)
    deadline, buf, size, taken = 0.0, bytearray(), 4, 0
    try:
        while len(buf) < size:
            if buf:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = sock.recv(min(size - len(buf), CHUNK))
            if not chunk:
                raise ConnectionError("the client closed its connection")
            deadline = deadline or time.monotonic() + FRAME_S
            if (over := len(buf) + len(chunk) - 4 - SMALL - taken) > 0:
                budget.take(over)
                taken += over
            buf += chunk
            if size == 4 and len(buf) == 4:
                size += int.from_bytes(buf, "big")
                if size > MAX_FRAME + 4:
                    raise ConnectionError(f"a frame of {size - 4} bytes (at most {MAX_FRAME})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"a frame not received within {FRAME_S:g}s")
        return _message(bytes(buf[4:]))
    finally:
        budget.take(-taken)
