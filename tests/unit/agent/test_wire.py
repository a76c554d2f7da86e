"""What the agents read from their store (ddpfleet_agent/wire.py, peers.py, membership.py): a
value is read only when sealed for its key and this launch, checked before it is parsed; the
server takes only the agents' keys and sealed values; a refused write of an agent's own does
not end its run; a copied request to come back, set again, forces no regrow."""

from __future__ import annotations

import json
import os

import pytest

from ddpfleet_agent import store, wire
from ddpfleet_agent.cli import parse_args
from ddpfleet_agent.peers import Peers
from ddpfleet_agent.store import StoreClient, StoreError, StoreServer
from ddpfleet_agent.wire import SHAPES, admits, launch_key, seal, unseal

SECRET = os.urandom(32).hex().encode()
KEY = launch_key(SECRET, "a1")
DEEP = "[" * 200000  # RecursionError in json.loads: it failed a run from one unsigned set


def _mac(name: str, body: str) -> str:
    return wire._mac(KEY, name, body.encode()).decode()


@pytest.mark.parametrize(
    "raw",
    [
        DEEP,
        DEEP.encode(),
        '{"mac": "' + "0" * 64 + '", "v": ' + DEEP + "}",  # its layout, not its MAC
        '{"mac": "' + _mac("stop", DEEP) + '", "v": ' + DEEP + "}",  # sealed, and too deep
        '{"mac": "' + _mac("stop", "[1]") + '", "v": [1]}',  # sealed, not an object
        b"\xff\xfe",
        "",
        None,
        12,
        json.dumps({"v": {"by": "h0"}, "mac": "x"}),
    ],
    ids=[
        "deep",
        "deep-bytes",
        "deep-layout",
        "deep-sealed",
        "list",
        "not-utf8",
        "empty",
        "none",
        "int",
        "bad-mac",
    ],
)
def test_a_value_that_is_not_sealed_for_its_key_is_none_whatever_it_raises(raw) -> None:
    assert unseal(KEY, "stop", raw) is None


def test_a_value_over_the_size_cap_is_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    sealed = seal(KEY, "stop", {"by": "h0", "pad": "x" * wire.MAX_VALUE})
    parsed: list[object] = []
    monkeypatch.setattr(wire.json, "loads", parsed.append)
    assert unseal(KEY, "stop", sealed) is None
    assert parsed == []


def test_a_value_is_bound_to_its_key_its_generation_and_the_launch() -> None:
    value = {"host": "h1", "reason": "r", "rank": 1}
    assert unseal(KEY, "failure@2", seal(KEY, "failure@2", value)) == value
    assert unseal(KEY, "failure@3", seal(KEY, "failure@2", value)) is None  # another generation
    assert unseal(KEY, "failure@2", seal(launch_key(SECRET, "a0"), "failure@2", value)) is None
    assert unseal(KEY, "failure@2", seal(SECRET, "failure@2", value)) is None


def test_the_largest_value_agents_write_is_far_under_the_cap() -> None:
    """A host of 64 ranks: its rank views with a cause, and its forensics record, every field at
    its longest (floats of 24 characters, a failure's 500-character reason, long stack places)."""
    big = 1.2345678901234567e300
    numbers = dict.fromkeys(wire.RANK_NUMBERS, big)
    views = [{**numbers, "rank": r, "phase": "checkpoint-save"} for r in range(64)]
    cause = {"host": "h" * 64, "reason": "r" * 500, "rank": 63, "node_rank": 99999}
    ranks = seal(KEY, "ranks/99999@999999", {"state": "exited", "ranks": views, "cause": cause})
    where = {"what": "w" * 200, "at": "a" * 300}
    dump = {"host": "h" * 64, "host_state": {"load": [1.0, 2.0, 3.0], "note": "x" * 200},
            "ranks": [{"rank": r, "pid": 4194304, "state": "S", "fds": 65536, "where": where,
                       "error": "e" * 300} for r in range(64)]}  # fmt: skip
    dumped = seal(KEY, "dumped/99999@999999", dump)
    assert SHAPES["ranks"](json.loads(ranks)["v"])
    assert max(len(ranks), len(dumped)) * 16 < wire.MAX_VALUE, (len(ranks), len(dumped))


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_the_server_takes_every_key_kind_of_shapes_and_its_node_and_generation(kind) -> None:
    check = admits(KEY)
    for name in (kind, f"{kind}/3", f"{kind}@2", f"{kind}/12345@999999"):
        assert check("get", name, None) == ""
        assert check("set", name, seal(KEY, name, {}).encode()) == ""
        assert "not sealed" in check("set", name, json.dumps({"x": 1}).encode())
        assert "not sealed" in check("set", name, seal(KEY, f"{name}x", {}).encode())
        deleted = check("delete_key", name, None)
        assert deleted == "" if name.startswith("join/") else "not deleted by" in deleted


@pytest.mark.parametrize(
    "name",
    [
        "k",
        "stop/",
        "stop/x",
        "ranks/123456",
        "ranks/1@1234567",
        "ranks/1/2",
        "Stop",
        "stops",
        " stop",
        "stop\n",
        "../stop",
        "ranks@1/1",
    ],
)
def test_the_server_refuses_a_key_agents_do_not_use(name) -> None:
    assert "not a key the agents use" in admits(KEY)("get", name, None)


@pytest.fixture
def peers():
    """node rank 0's Peers of a run of 3 hosts, on a store served like the agents' own."""
    args = ["--run-dir", "/nonexistent", "--run-id", "t1", "--hosts", "h0,h1,h2", "--host", "h0",
            "--node-rank", "0", "--store", "127.0.0.1:1", "--attempt", "a1", "--key-file", "k",
            "--", "true"]  # fmt: skip
    notes: list[str] = []
    p = Peers(parse_args(args), notes.append)
    server = StoreServer("127.0.0.1", 0, admits(KEY))
    p.key, p.store = KEY, StoreClient("127.0.0.1", server.port, 5)
    p.notes = notes  # type: ignore[attr-defined]
    yield p
    p.store.close()
    server.close()


def test_a_deep_value_is_ignored_and_named_once(peers) -> None:
    for _ in range(3):
        assert peers._shaped("stop", DEEP) is None
    assert len(peers.notes) == 1
    assert peers.notes[0].startswith("ignored the store's stop: not signed with the run's key")


def test_a_full_store_refusing_an_agent_s_write_is_said_once_and_the_run_goes_on(
    peers, monkeypatch: pytest.MonkeyPatch
) -> None:
    peers.members = [0, 1]
    peers.exchange({"state": "running", "ranks": []})
    monkeypatch.setattr(store, "MAX_BYTES", 0)  # full: nothing new is taken
    for _ in range(3):
        failure, stop = peers.exchange({"state": "running", "ranks": [{"rank": 0}] * 9})
        assert (failure, stop) == (None, None)
    assert peers.notes == ["the store refused ranks/0: the store is full (0 bytes)"]
    peers.publish_dump({"host": "h0", "ranks": []})  # a new key: refused, said once
    assert peers.notes[1:] == ["the store refused dumped/0: the store is full (0 bytes)"]
    claimed = {"host": "h1", "reason": "r", "rank": 1}
    assert peers.claim(claimed) == claimed  # its own, though the store could not take it


def test_a_request_to_come_back_set_again_after_its_welcome_is_not_taken(peers) -> None:
    """h2 left out asks to come back, is welcomed into generation 3; its copied request, set
    again later while h2 is out once more, forces no regrow; h2's own new request does."""
    peers.members = [0, 1]
    asking = {"host": "h2", "time": 1.0, "generation": 0}
    copied = seal(KEY, "join/2", asking)
    peers.store.set("join/2", copied)
    assert peers.joins() == [2]
    peers.welcome(3, [2])
    assert not peers.store.check(["join/2"])  # taken: the request is answered and gone
    peers.store.set("join/2", copied)  # a copy, set again by anyone who read it
    assert peers.joins() == []
    peers.store.set("welcome/2", seal(KEY, "welcome/2", {"generation": 0, "nodes": [0, 1, 2]}))
    assert peers.joins() == []  # nor with an older welcome's copy set over the newer one
    peers._set("join/2", {**asking, "generation": 3})  # h2, out again after generation 3
    assert peers.joins() == [2]
    with pytest.raises(StoreError, match="not sealed"):
        peers.store.set("join/2", json.dumps({**asking, "generation": 9}))


def test_the_server_refuses_to_delete_a_key_the_agents_wait_for(peers) -> None:
    """A stray client deleting node rank 0's word on who restarts (``members@<g>``) left the
    others waiting for it until they counted the store as lost."""
    peers._set("members@1", {"nodes": [0, 1], "missing": []})
    with pytest.raises(StoreError, match="members@1 is not deleted by the agents"):
        peers.store.delete_key("members@1")
    assert peers.store.check(["members@1"])


@pytest.mark.parametrize(
    "weights", [{"h2": 0}, {"h2": -1.0}, {"h2": "fast"}, [0.3], {"h2": float("nan")}, {"h2": True}]
)
def test_new_shares_that_are_not_positive_numbers_are_no_failure_and_no_welcome(weights) -> None:
    """A failure marked rebalance and a welcome carry each host's weight to every agent (and
    into the ranks' environment): of another shape they are ignored like any bad value."""
    failure = {"host": "h2", "reason": "new shares", "rank": None}
    assert SHAPES["failure"]({**failure, "rebalance": {"h2": 0.3}})
    assert not SHAPES["failure"]({**failure, "rebalance": weights})
    welcome = {"generation": 3, "nodes": [0, 1, 2]}
    assert SHAPES["welcome"]({**welcome, "weights": {"h0": 1.0}})
    assert not SHAPES["welcome"]({**welcome, "weights": weights})


@pytest.mark.parametrize(
    ("field", "value"),
    [("causes", [{"host": 2, "reason": "r"}]), ("causes", "r"), ("causes", [None]),
     ("causes", {"host": "h2"}), ("attempts", ["a1"]), ("attempts", {"hosts": []}),
     ("joining", ["h2"]), ("joining", 2)],
)  # fmt: skip
def test_a_welcome_whose_restarts_or_starts_are_of_another_shape_is_ignored(field, value) -> None:
    """A welcome carries the run's restarts (their causes) and starts (attempts), which the host
    let in takes as its own, and the hosts let in (joining), which its own entry names."""
    welcome = {"generation": 3, "nodes": [0, 1, 2], "causes": None, "attempts": None}
    assert SHAPES["welcome"](welcome)
    causes = [{"host": "h2", "reason": "r", "rank": None}]
    record = {"causes": causes, "attempts": [{"hosts": ["h0"]}], "joining": [2]}
    assert SHAPES["welcome"]({**welcome, **record})
    assert not SHAPES["welcome"]({**welcome, field: value})
