"""The run's key-value store, which the hosts' agents share (peers.py): node rank 0's agent
serves it on ``--store``, every agent (node rank 0's too) is a client. Standard library only.

It replaced torch's c10d TCPStore, whose import was most of an agent's start: ~2.2 CPU-s and
~630 MB resident before the agent could start its command, on every host of every launch
(2-core AMD EPYC, 2026-12-01), and a user's image needed torch for the agent alone. The five
calls the agents make keep c10d's meaning: ``set``, ``get``, ``check``, ``compare_set`` and
``delete_key``; ``get`` answers None for a missing key where c10d waits for it (the agents
always ``check`` first).

Wire: a request and its answer are each one frame, a 4-byte big-endian length and that many
bytes of a JSON object; values travel base64-coded, so a client may store any bytes. A frame
over ``MAX_FRAME`` or that is not such an object closes the connection; a request the server
cannot apply is answered with ``error`` (raised on the client as ``StoreError``). The store
takes any client on the cluster network, as c10d's did: every value the agents write is sealed
with the run's secret (wire.py) and what fails the check is ignored, and the store holds at
most ``MAX_BYTES`` of keys and values, so a stray client cannot exhaust the host's memory.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import socket
import socketserver
import threading
import time

MAX_FRAME = 4 << 20  # bytes of one request or answer (the agents' values are a few KB)
MAX_BYTES = 64 << 20  # keys and values the store holds in all
CONNECT_RETRY_S = 0.2  # between attempts while the server is not up yet (or not reachable)


class StoreError(RuntimeError):
    """The server refused the request (its ``error``)."""


def _encode(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode("ascii")


def _decode(text: object) -> bytes:
    if not isinstance(text, str):
        raise StoreError("a value must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise StoreError("a value must be a base64 string") from None


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def send_frame(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(len(data).to_bytes(4, "big") + data)


def _exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("the store's connection closed")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> dict:
    size = int.from_bytes(_exactly(sock, 4), "big")
    if size > MAX_FRAME:
        raise ConnectionError(f"a frame of {size} bytes (at most {MAX_FRAME})")
    try:
        message = json.loads(_exactly(sock, size))
    except (ValueError, UnicodeDecodeError):
        raise ConnectionError("a frame that is not JSON") from None
    if not isinstance(message, dict):
        raise ConnectionError("a frame that is not a JSON object")
    return message


class _Data:
    """The store's keys and values, under one lock."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.size = 0
        self.lock = threading.Lock()

    def _put(self, key: str, value: bytes) -> None:
        old = self.values.get(key)
        grown = len(value) - len(old) if old is not None else len(key) + len(value)
        if self.size + grown > MAX_BYTES:
            raise StoreError(f"the store is full ({MAX_BYTES} bytes)")
        self.values[key] = value
        self.size += grown

    def apply(self, req: dict) -> dict:
        op = req.get("op")
        keys = req.get("keys") if op == "check" else [req.get("key")]
        named = isinstance(keys, list) and all(isinstance(k, str) and k for k in keys)
        if not (keys and named):
            raise StoreError("keys must be non-empty strings")
        key = keys[0]
        with self.lock:
            if op == "set":
                self._put(key, _decode(req.get("value")))
                return {}
            if op == "get":
                return {"value": _encode(self.values.get(key))}
            if op == "check":
                return {"found": all(k in self.values for k in keys)}
            if op == "compare_set":  # c10d's: a missing key counts as the empty value only
                expected, desired = _decode(req.get("expected")), _decode(req.get("desired"))
                current = self.values.get(key)
                if current == expected or (current is None and not expected):
                    self._put(key, desired)
                    return {"value": _encode(desired)}
                return {"value": _encode(current if current is not None else expected)}
            if op == "delete_key":
                old = self.values.pop(key, None)
                if old is not None:
                    self.size -= len(key) + len(old)
                return {"deleted": old is not None}
        raise StoreError(f"unknown op {op!r}")


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        with self.server.lock:
            self.server.connections.add(self.request)
        with contextlib.suppress(OSError):  # ConnectionError too: a client gone or misbehaving
            while True:
                req = recv_frame(self.request)
                try:
                    answer = self.server.data.apply(req)
                except StoreError as exc:
                    answer = {"error": str(exc)}
                send_frame(self.request, answer)

    def finish(self) -> None:
        with self.server.lock:
            self.server.connections.discard(self.request)


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True  # node rank 0's agent started again on the port it had
    daemon_threads = True  # a client's thread does not keep the agent from exiting
    data: _Data
    lock: threading.Lock
    connections: set[socket.socket]


def server_class(base: type[socketserver.TCPServer], host: str, port: int) -> type:
    """``base`` bound to the address family of ``host`` (IPv4 or IPv6): socketserver's
    servers are IPv4 unless told, where a cluster address may be IPv6."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return type(base.__name__, (base,), {"address_family": family})


class StoreServer:
    """Serve the store on ``host:port`` (the address family of ``host``: IPv6 too) from a
    daemon thread of this process; OSError when the address cannot be bound."""

    def __init__(self, host: str, port: int):
        self._server = server_class(_Server, host, port)((host, port), _Handler)
        self._server.data = _Data()
        self._server.lock = threading.Lock()
        self._server.connections = set()
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                         daemon=True, name="store").start()  # fmt: skip

    def close(self) -> None:
        """Stop serving: the listening socket and every client's connection close."""
        self._server.shutdown()
        self._server.server_close()
        with self._server.lock:
            for conn in self._server.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


class StoreClient:
    """One connection to the store. Connecting tries again until ``timeout`` s have passed
    (the server's agent may not have started yet), then raises ConnectionError; each call
    waits at most ``timeout`` s for its answer (socket.timeout, an OSError, after that). A
    call raises OSError when the connection fails and StoreError when the server refuses it.
    Calls from several threads take turns."""

    def __init__(self, host: str, port: int, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self._sock = socket.create_connection((host, port), timeout=max(left, 0.1))
                break
            except OSError as exc:
                if left <= CONNECT_RETRY_S:
                    raise ConnectionError(
                        f"no store at {host}:{port} within {timeout:g}s ({exc.strerror or exc})"
                    ) from None
                time.sleep(CONNECT_RETRY_S)
        self._sock.settimeout(timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()

    def _ask(self, request: dict) -> dict:
        with self._lock:
            send_frame(self._sock, request)
            answer = recv_frame(self._sock)
        if "error" in answer:
            raise StoreError(str(answer["error"]))
        return answer

    def set(self, key: str, value: bytes | str) -> None:
        self._ask({"op": "set", "key": key, "value": _encode(_bytes(value))})

    def get(self, key: str) -> bytes | None:
        value = self._ask({"op": "get", "key": key}).get("value")
        return None if value is None else _decode(value)

    def check(self, keys: list[str]) -> bool:
        return bool(self._ask({"op": "check", "keys": keys}).get("found"))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        old, new = _encode(_bytes(expected)), _encode(_bytes(desired))
        answer = self._ask({"op": "compare_set", "key": key, "expected": old, "desired": new})
        return _decode(answer.get("value"))

    def delete_key(self, key: str) -> bool:
        return bool(self._ask({"op": "delete_key", "key": key}).get("deleted"))

    def close(self) -> None:
        """Close the connection; a call blocked on it in another thread fails at once."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
