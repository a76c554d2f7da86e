"""What a client on the network can hold of the store's host (ddpfleet_agent/store.py,
wire.py), over real sockets: connections beyond the cap closed at once, an idle one closed
(and a client of the store's own connecting again without a word), a half-sent frame dropped
at its deadline, the bytes of frames being received bounded, a frame too deep to parse."""

from __future__ import annotations

import socket
import time

import pytest

from ddpfleet_agent import store, wire
from ddpfleet_agent.store import StoreClient, StoreServer


@pytest.fixture
def server():
    served = StoreServer("127.0.0.1", 0)
    yield served
    served.close()


def _raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """The server closed ``sock`` within ``seconds`` (EOF or reset)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _frame(payload: bytes, size: int | None = None) -> bytes:
    return (len(payload) if size is None else size).to_bytes(4, "big") + payload


def test_connections_beyond_the_cap_are_closed_at_once(server, monkeypatch) -> None:
    monkeypatch.setattr(store, "MAX_CONNECTIONS", 3)
    held = [StoreClient("127.0.0.1", server.port, 5) for _ in range(3)]
    held[0].set("k", "v")
    extra = _raw(server.port)
    assert _closed_within(extra, 2)
    held[1].close()
    time.sleep(0.3)  # its thread has ended
    again = StoreClient("127.0.0.1", server.port, 5)
    assert again.get("k") == b"v"
    for client in [*held, again]:
        client.close()


def test_an_idle_connection_is_closed_and_a_client_connects_again_for_its_next_call(
    server, monkeypatch
) -> None:
    monkeypatch.setattr(wire, "IDLE_S", 0.5)
    idle = _raw(server.port)
    started = time.monotonic()
    assert _closed_within(idle, 5)
    assert 0.4 < time.monotonic() - started < 3
    client = StoreClient("127.0.0.1", server.port, 5)
    client.set("k", "v")
    first = client._sock
    time.sleep(1.2)  # as an agent that paused longer: the server closed its connection
    assert client.get("k") == b"v"
    assert client.compare_set("c", "", "x") == b"x"
    assert client._sock is not first


def test_a_half_sent_frame_is_dropped_at_its_deadline(server, monkeypatch) -> None:
    monkeypatch.setattr(wire, "FRAME_S", 0.5)
    slow = _raw(server.port)
    slow.sendall(_frame(b'{"op": "get", ', size=40))  # and nothing more
    started = time.monotonic()
    assert _closed_within(slow, 5)
    assert time.monotonic() - started < 2
    trickle = _raw(server.port)  # a byte at a time, never done within the deadline
    trickle.sendall((60).to_bytes(4, "big"))
    started = time.monotonic()
    while not _closed_within(trickle, 0.05):
        assert time.monotonic() - started < 2, "a trickled frame outlived its deadline"
        trickle.sendall(b" ")
    assert time.monotonic() - started > 0.4


def test_the_bytes_of_frames_being_received_are_bounded(server, monkeypatch) -> None:
    """Two clients each announce a frame of MAX_FRAME and send part of it: the bytes past
    SMALL count against MAX_PENDING, held as they arrive (not the announced size); the one that
    would pass it is closed, the budget is given back, and small frames are served meanwhile."""
    monkeypatch.setattr(wire, "SMALL", 1000)
    monkeypatch.setattr(wire, "MAX_PENDING", 5000)
    client = StoreClient("127.0.0.1", server.port, 5)
    first, second = _raw(server.port), _raw(server.port)
    first.sendall(_frame(b"[" + b" " * 4000, size=wire.MAX_FRAME))
    time.sleep(0.3)
    assert server.held == 3001
    client.set("k", "v")  # a small frame takes none of it
    second.sendall(_frame(b"[" + b" " * 4000, size=wire.MAX_FRAME))
    assert _closed_within(second, 3)
    assert not _closed_within(first, 0.3)
    first.close()
    time.sleep(0.3)
    assert server.held == 0
    assert client.get("k") == b"v"


@pytest.mark.parametrize(
    "payload",
    [b"[" * 200000, b'{"op": "set", "key": "k", "value": ' + b"[" * 100000 + b"}", b"\xff"],
    ids=["deep-array", "deep-value", "not-utf8"],
)
def test_a_frame_that_cannot_be_parsed_closes_only_its_connection(server, payload) -> None:
    client = StoreClient("127.0.0.1", server.port, 5)
    client.set("k", "v")
    bad = _raw(server.port)
    bad.sendall(_frame(payload))
    assert _closed_within(bad, 3)
    assert client.get("k") == b"v"
