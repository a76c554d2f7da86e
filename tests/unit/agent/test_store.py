"""The agents' store (ddpfleet_agent/store.py) over real sockets: c10d's meaning of the five
calls, one first claim among clients racing, a client that starts before the server, a server
that is gone or cut off, a stray client's oversized or malformed frames, IPv6, and an agent
that starts without importing torch."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddpfleet_agent import store, wire
from ddpfleet_agent.store import StoreClient, StoreError, StoreServer

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def served():
    server = StoreServer("127.0.0.1", 0)
    clients: list[StoreClient] = []

    def client(timeout: float = 5) -> StoreClient:
        clients.append(StoreClient("127.0.0.1", server.port, timeout))
        return clients[-1]

    yield server, client
    for c in clients:
        c.close()
    server.close()


def test_set_get_check_delete_keep_c10d_s_meaning(served) -> None:
    _, client = served
    a, b = client(), client()
    assert a.get("k") is None
    assert not a.check(["k"])
    a.set("k", "v1")
    b.set("bytes", b"\x00\xff not utf-8")
    assert b.get("k") == b"v1"
    assert a.get("bytes") == b"\x00\xff not utf-8"
    assert a.check(["k", "bytes"])
    assert not a.check(["k", "other"])
    assert b.delete_key("k")
    assert not b.delete_key("k")
    assert a.get("k") is None


def test_compare_set_sets_a_missing_key_only_for_the_empty_expected_value(served) -> None:
    _, client = served
    c = client()
    assert c.compare_set("missing", "x", "new") == b"x"  # c10d: expected back, nothing set
    assert not c.check(["missing"])
    assert c.compare_set("claim", "", "first") == b"first"
    assert c.compare_set("claim", "", "second") == b"first"  # held: the holder comes back
    assert c.compare_set("claim", "first", "third") == b"third"  # the expected value: replaced
    assert c.get("claim") == b"third"


def test_one_claim_wins_among_clients_racing(served) -> None:
    _, client = served
    clients = [client() for _ in range(8)]
    got: list[bytes] = [b""] * len(clients)
    start = threading.Barrier(len(clients))

    def claim(i: int) -> None:
        start.wait()
        got[i] = clients[i].compare_set("failure", "", f"host {i}")

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(set(got)) == 1, got
    assert got[0] == clients[0].get("failure")


def test_calls_from_threads_sharing_a_client_each_get_their_own_answer(served) -> None:
    _, client = served
    c = client()
    wrong: list[str] = []

    def work(n: int) -> None:
        for i in range(50):
            c.set(f"t{n}", f"{n}:{i}")
            if c.get(f"t{n}") != f"{n}:{i}".encode():
                wrong.append(f"{n}:{i}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert wrong == []


def test_a_client_started_before_its_server_connects_once_it_serves() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    servers: list[StoreServer] = []
    later = threading.Timer(0.6, lambda: servers.append(StoreServer("127.0.0.1", port)))
    later.start()
    try:
        client = StoreClient("127.0.0.1", port, 10)
        client.set("k", "v")
        assert client.get("k") == b"v"
        client.close()
    finally:
        later.join()
        for server in servers:
            server.close()


def test_no_server_is_one_connection_error_after_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionError) as raised:
        StoreClient("127.0.0.1", 1, 1)
    took = time.monotonic() - started
    assert 0.8 <= took < 3, took
    assert str(raised.value).startswith("no store at 127.0.0.1:1 within 1s (")
    assert "\n" not in str(raised.value)


def test_a_server_gone_fails_the_next_call_with_an_os_error(served) -> None:
    server, client = served
    c = client()
    c.set("k", "v")
    server.close()  # as when the serving agent's process ends
    with pytest.raises(ConnectionError):
        c.get("k")
    with pytest.raises(ConnectionError, match="no store at"):
        StoreClient("127.0.0.1", server.port, 0.5)


def test_an_unanswered_call_times_out_and_close_frees_a_blocked_call() -> None:
    """A server that accepts but never answers (its host frozen, or its packets dropped)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = StoreClient("127.0.0.1", listener.getsockname()[1], 0.5)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            client.get("k")
        assert time.monotonic() - started < 2
        blocked = StoreClient("127.0.0.1", listener.getsockname()[1], 30)
        failed: list[BaseException] = []
        worker = threading.Thread(target=lambda: _call(blocked, failed))
        worker.start()
        time.sleep(0.3)
        blocked.close()
        worker.join(5)
        assert not worker.is_alive()
        assert failed, "the blocked call did not fail"
        assert isinstance(failed[0], OSError)


def _call(client: StoreClient, failed: list[BaseException]) -> None:
    try:
        client.get("k")
    except OSError as exc:
        failed.append(exc)


def raw_frame(port: int, data: bytes) -> bytes:
    """What the server sends back for ``data`` (b'' once it closed the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        try:
            return s.recv(1 << 16)
        except ConnectionResetError:
            return b""


def test_a_stray_client_s_bad_frames_close_its_connection_and_others_go_on(served) -> None:
    server, client = served
    c = client()
    c.set("k", "v")
    too_big = (wire.MAX_FRAME + 1).to_bytes(4, "big")
    assert raw_frame(server.port, too_big + b"x" * 100) == b""
    assert raw_frame(server.port, (4).to_bytes(4, "big") + b"nope") == b""
    assert raw_frame(server.port, (2).to_bytes(4, "big") + b"[]") == b""
    # a well-formed request the store cannot apply gets an error, and the connection stays
    with pytest.raises(StoreError, match="unknown op"):
        c._ask({"op": "flush", "key": "k"})
    with pytest.raises(StoreError, match="base64"):
        c._ask({"op": "set", "key": "k", "value": "not base64!"})
    with pytest.raises(StoreError, match="keys"):
        c._ask({"op": "get", "key": ""})
    with pytest.raises(StoreError, match="keys"):
        c._ask({"op": "check", "keys": []})
    assert c.get("k") == b"v"


def test_the_store_counts_the_memory_its_entries_take_and_frees_what_is_deleted(
    served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What Python holds (key and value objects, the dictionary's share), not only their bytes;
    a full store still takes a value no larger in place of a key's own."""
    _, client = served
    entry = store.cost("a", b"x" * 600)
    assert entry == sys.getsizeof("a") + sys.getsizeof(b"x" * 600) + store.ENTRY
    monkeypatch.setattr(store, "MAX_BYTES", entry + 400)
    c = client()
    c.set("a", "x" * 600)
    with pytest.raises(StoreError, match="full"):
        c.set("b", "x" * 300)  # 300 bytes of value fit; its entry does not
    c.set("a", "y" * 900)  # replacing a value counts only the difference
    with pytest.raises(StoreError, match="full"):
        c.set("a", "y" * 1100)
    monkeypatch.setattr(store, "MAX_BYTES", 0)  # full: a value no larger is still taken
    c.set("a", "z" * 900)
    c.set("a", "z" * 10)
    assert c.delete_key("a")
    monkeypatch.setattr(store, "MAX_BYTES", entry + 400)
    c.set("b", "x" * 600)
    assert c.get("b") == b"x" * 600


def test_the_store_serves_on_ipv6() -> None:
    try:
        server = StoreServer("::1", 0)
    except OSError as exc:  # a host without IPv6 loopback
        pytest.skip(f"no ::1 here: {exc}")
    try:
        client = StoreClient("::1", server.port, 5)
        client.set("k", json.dumps({"v": 1}))
        assert json.loads(client.get("k") or b"") == {"v": 1}
        client.close()
    finally:
        server.close()


def test_a_busy_port_is_an_os_error(served) -> None:
    server, _ = served
    with pytest.raises(OSError, match="in use"):
        StoreServer("127.0.0.1", server.port)


def test_the_agent_starts_without_importing_torch() -> None:
    """What the store is for: the agent's start-up path (its command line, supervision,
    peers, records, the exporter) loads no torch, which took ~2.2 CPU-s and ~630 MB."""
    code = (
        "import sys; import ddpfleet_agent.__main__, ddpfleet_agent.supervise, "
        "ddpfleet_agent.exporter; print(sorted(m for m in sys.modules if m.startswith('torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "[]"
