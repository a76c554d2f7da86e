"""The run's key-value store, which the hosts' agents share (peers.py): node rank 0's agent
serves it on ``--store``, every agent (its own too) is a client. Standard library only: torch's
c10d TCPStore, which it replaced, cost an agent ~2.2 CPU-s and ~630 MB to import, and a user's
image torch for the agent alone. Its five calls keep c10d's meaning, but ``get`` answers None
for a missing key. A request and its answer are each one frame (wire.py), values base64-coded;
a frame the server cannot read closes the connection, a request it cannot apply is answered
with ``error`` (``StoreError``). Any client on the cluster network may connect, within bounds:
``MAX_CONNECTIONS`` at once, wire.py's on each frame, ``MAX_BYTES`` of keys and values as Python
holds them (``cost``; a value replaced by one no larger always fits, so a full store never
refuses an agent's rewrite of its own key), and wire.admits: the agents' sealed keys only.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import socketserver
import sys
import threading
import time

from ddpfleet_agent import wire
from ddpfleet_agent.wire import Admits, Hangup, receive, recv_frame, send_frame

CONNECT_RETRY_S = 0.2  # between attempts while the server is not up yet (or not reachable)
# One connection per agent (a reconnect closes the old one first): 256 serves runs of 200 hosts
# and more, with room for the probes of hosts left out (peers.reconnect); each is a thread.
MAX_CONNECTIONS = 256

MAX_BYTES = 64 << 20  # memory the keys and values take in all
# A dictionary's own memory per entry beyond key and value: 8 bytes of index and 24 of entry in
# tables up to ~2x the entries (38 an entry measured, CPython 3.11), and pymalloc's rounding.
ENTRY = 96


class StoreError(RuntimeError):
    """The server refused the request (its ``error``)."""


def encode(value: bytes | str | None) -> str | None:
    if isinstance(value, str):
        value = value.encode()
    return None if value is None else base64.b64encode(value).decode("ascii")


def decode(text: object) -> bytes:
    """``text`` as JSON gave it (StoreError unless a base64 string: JSON gives no bytes)."""
    try:
        return base64.b64decode(text, validate=True)  # type: ignore[arg-type]
    except (ValueError, TypeError):  # binascii.Error is a ValueError, as is non-ASCII text
        raise StoreError("a value must be a base64 string") from None


def cost(key: str, value: bytes) -> int:
    """Bytes of memory one entry takes in the store."""
    return sys.getsizeof(key) + sys.getsizeof(value) + ENTRY


def server_class(base: type[socketserver.TCPServer], host: str, port: int) -> type:
    """``base`` bound to the address family of ``host``: socketserver's are IPv4 unless told."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return type(base.__name__, (base,), {"address_family": family})


class StoreServer(socketserver.ThreadingTCPServer):
    """Serve the store on ``host:port`` (the address family of ``host``: IPv6 too) from a
    daemon thread of this process; OSError when the address cannot be bound."""

    allow_reuse_address = True  # node rank 0's agent started again on the port it had
    daemon_threads = True  # a client's thread does not keep the agent from exiting
    request_queue_size = 64  # connections waiting to be accepted (5 unless told): a burst of
    # a stray client's does not leave an agent's reconnect waiting on TCP's SYN retries

    def __init__(self, host: str, port: int, admits: Admits | None = None):
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        super().__init__((host, port), None)  # no handler class: finish_request serves
        self.admits = admits  # why the server refuses a request
        self.lock = threading.Lock()  # over the connections, the keys and values, the budget
        self.connections: set[socket.socket] = set()
        self.values: dict[str, bytes] = {}
        self.size = 0  # their cost in all
        self.held = 0  # bytes of large frames being received, all connections together
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, args=(0.1,), daemon=True, name="store").start()

    def hold(self, size: int) -> None:
        """``size`` bytes more held (negative: given back); ConnectionError past MAX_PENDING."""
        with self.lock:
            if size > 0 and self.held + size > wire.MAX_PENDING:
                raise ConnectionError("too many bytes of frames being received")
            self.held += size

    def verify_request(self, request: socket.socket, client_address: tuple) -> bool:
        """A connection gets a thread, or is closed at once when MAX_CONNECTIONS are open."""
        with self.lock:
            if len(self.connections) >= MAX_CONNECTIONS:
                return False
            self.connections.add(request)
            return True

    def finish_request(self, request: socket.socket, client_address: tuple) -> None:
        """Answer the client's requests on its own thread until it goes (timeouts too)."""
        try:
            with contextlib.suppress(OSError):
                while True:
                    req = receive(request, self.hold)
                    try:
                        answer = self.apply(req)
                    except StoreError as exc:
                        answer = {"error": str(exc)}
                    send_frame(request, answer)
        finally:
            with self.lock:
                self.connections.discard(request)

    def apply(self, req: dict) -> dict:
        op = req.get("op")
        keys = req.get("keys") if op == "check" else [req.get("key")]
        if not (keys and isinstance(keys, list) and all(isinstance(k, str) and k for k in keys)):
            raise StoreError("keys must be non-empty strings")
        key, value = keys[0], None
        if op in ("set", "compare_set"):
            value = decode(req.get("value" if op == "set" else "desired"))
        # checked before the lock: a MAC over a value of up to 1 MiB keeps no other call waiting
        for k in keys:
            if self.admits and (why := self.admits(str(op), k, value)):
                raise StoreError(why)
        with self.lock:
            current = self.values.get(key)
            if op == "get":
                return {"value": encode(current)}
            if op == "check":
                return {"found": all(k in self.values for k in keys)}
            if op == "delete_key":
                if current is not None:
                    self.size -= cost(key, self.values.pop(key))
                return {"deleted": current is not None}
            if op == "compare_set":
                # c10d's meaning: a missing key counts as the empty value only
                expected = decode(req.get("expected"))
                if current != expected and (current is not None or expected):
                    return {"value": encode(current if current is not None else expected)}
            if value is None:
                raise StoreError(f"unknown op {op!r}")
            grown = cost(key, value) - (cost(key, current) if current is not None else 0)
            if grown > 0 and self.size + grown > MAX_BYTES:
                raise StoreError(f"the store is full ({MAX_BYTES} bytes)")
            self.values[key], self.size = value, self.size + grown
            return {} if op == "set" else {"value": encode(value)}

    def close(self) -> None:
        """Stop serving: the listening socket and every client's connection close."""
        self.shutdown()
        self.server_close()
        with self.lock:
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


class StoreClient:
    """One connection to the store, from threads in turn. Connecting retries for ``timeout`` s
    (the server may not be up yet), then raises ConnectionError; a call waits ``timeout`` s
    for its answer, raises OSError when the connection fails and StoreError when refused. A
    connection the server closed unread (idle for wire.IDLE_S) is opened again once."""

    def __init__(self, host: str, port: int, timeout: float):
        self._where, self._timeout, self._closed = (host, port), timeout, False
        self._sock = self._connect(retry=True)
        self._lock = threading.Lock()

    def _connect(self, retry: bool) -> socket.socket:
        (host, port), deadline = self._where, time.monotonic() + self._timeout
        while True:
            left = deadline - time.monotonic()
            try:
                sock = socket.create_connection(self._where, timeout=max(left, 0.1))
                break
            except OSError as exc:
                if not retry or left <= CONNECT_RETRY_S:
                    why = f"{self._timeout:g}s ({exc.strerror or exc})"
                    raise ConnectionError(f"no store at {host}:{port} within {why}") from None
                time.sleep(CONNECT_RETRY_S)
        sock.settimeout(self._timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _ask(self, request: dict) -> dict:
        with self._lock:
            for again in (True, False):
                try:
                    send_frame(self._sock, request)
                    answer = recv_frame(self._sock)
                    break
                except (Hangup, BrokenPipeError, ConnectionResetError):
                    if self._closed or not again:  # close() from another thread, or twice
                        raise
                    self._sock.close()  # the server read nothing of it: the call again, once
                    self._sock = self._connect(retry=False)
        if "error" in answer:
            raise StoreError(str(answer["error"]))
        return answer

    def set(self, key: str, value: bytes | str) -> None:
        self._ask({"op": "set", "key": key, "value": encode(value)})

    def get(self, key: str) -> bytes | None:
        value = self._ask({"op": "get", "key": key}).get("value")
        return None if value is None else decode(value)

    def check(self, keys: list[str]) -> bool:
        return bool(self._ask({"op": "check", "keys": keys}).get("found"))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        old, new = encode(expected), encode(desired)
        answer = self._ask({"op": "compare_set", "key": key, "expected": old, "desired": new})
        return decode(answer.get("value"))

    def delete_key(self, key: str) -> bool:
        return bool(self._ask({"op": "delete_key", "key": key}).get("deleted"))

    def close(self) -> None:
        """Close the connection; a call blocked on it in another thread fails at once."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
