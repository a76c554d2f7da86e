"""What the agents put in their store: the shape each key must have to be acted on, and the
seal that proves an agent of this run wrote it (``ddpfleet_agent.peers`` reads and writes them).

A value is ``{"mac": <hex>, "v": <the JSON value>}``, the MAC being HMAC-SHA256 over the key's
name, a newline and the value's JSON with sorted keys, under the launch's key: the run's secret
(``agent.key``) bound to the launch (``launch_key``), so a value copied from an earlier launch does
not pass in this one. A generation's keys end in ``@<g>`` (peers.py): the MAC covers the
generation through the name. A value is read only when it is at most ``MAX_VALUE`` bytes, has
that layout and its MAC matches, all checked before its JSON is parsed: what fails, for any
reason, is not a value (None).

The store's server (node rank 0's agent) takes only this: ``admits`` refuses a key of another
pattern than ``KEY`` (derived from ``SHAPES``: a key kind added there is accepted here), a
delete of a key agents do not delete (one they wait for), and a value not sealed for its key,
so a client without the secret can neither fill the store nor put anything in it an agent
would read, nor take away what the agents wait for.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable

from ddpfleet_agent.ranks import COUNTS, NUMBERS, number

# What each key must hold to be acted on, as the agents write it (``LocalRanks.record``,
# ``Judge.failure``, ``request_stop``, ``Ending.finish``). Every agent reads every key each
# round: a value of another shape (a store client that is not an agent) is ignored, and named
# once in the host's log, instead of raising in the supervision loop.
RANK_NUMBERS = (*COUNTS, *NUMBERS, "live_age", "progress_age")  # ranks.rank_views


def _number(value: object) -> bool:
    return value is None or number(value) is not None


def _text(value: object) -> bool:
    return value is None or isinstance(value, str)


def _weights(value: object) -> bool:
    """None, or each host's weight of the global batch (regrow.py): positive numbers."""
    if value is None:
        return True
    return isinstance(value, dict) and all(
        isinstance(h, str) and number(w) is not None and w > 0 for h, w in value.items()
    )


def _rank_view(r: object) -> bool:
    return (
        isinstance(r, dict)
        and type(r.get("rank")) is int
        and _text(r.get("phase"))
        and all(_number(r.get(k)) for k in RANK_NUMBERS)
    )


SHAPES: dict[str, Callable[[dict], bool]] = {
    "alive": lambda v: type(v.get("count")) is int,
    "ranks": lambda v: (
        isinstance(v.get("state"), str)
        and isinstance(v.get("ranks"), list)
        and all(_rank_view(r) for r in v["ranks"])
    ),
    "exit": lambda v: isinstance(v.get("outcome"), str) and _text(v.get("host")),
    "failure": lambda v: (
        isinstance(v.get("host"), str)
        and isinstance(v.get("reason"), str)
        and (v.get("rank") is None or type(v.get("rank")) is int)
        and _weights(v.get("rebalance"))
        and _weights(v.get("speeds"))
    ),
    "stop": lambda v: isinstance(v.get("by"), str),
    "dumped": lambda v: isinstance(v.get("host"), str) and isinstance(v.get("ranks"), list),
    "ready": lambda v: isinstance(v.get("host"), str),
    "join": lambda v: isinstance(v.get("host"), str) and type(v.get("generation")) is int,
    "welcome": lambda v: (
        type(v.get("generation")) is int
        and isinstance(v.get("nodes"), list)
        and all(type(n) is int for n in v["nodes"])
        and _weights(v.get("weights"))
    ),
    "leader": lambda v: type(v.get("node")) is int and type(v.get("generation")) is int,
    "members": lambda v: all(
        isinstance(v.get(k), list) and all(type(n) is int for n in v[k])
        for k in ("nodes", "missing")
    ),
}


# The keys agents use: a kind of SHAPES, then ``/<node rank>`` and ``@<generation>`` where the
# kind has them. Digits bounded: 5 for a node rank, 6 for a generation (restarts).
KEY = re.compile(rf"(?:{'|'.join(map(re.escape, SHAPES))})(?:/[0-9]{{1,5}})?(?:@[0-9]{{1,6}})?")

# A raw value's size cap, checked before anything else: the largest value agents write is a
# host's ``dumped/<n>`` or ``ranks/<n>`` of 64 ranks, ~58 KB and ~26 KB sealed with every field
# at its longest (test_wire.py); 1 MiB leaves room for ~1000 ranks a host.
MAX_VALUE = 1 << 20
DELETED = ("join/",)  # the only keys agents delete: a request answered (membership.welcome)
_HEAD, _MID, _TAIL = b'{"mac": "', b'", "v": ', b"}"  # seal()'s layout around MAC and value
_MAC_HEX = 64


def launch_key(secret: bytes, launch: str) -> bytes:
    """The key values of one launch (``--attempt``) are sealed under: the run's secret bound to
    it, so that a value of another launch fails the check in this one."""
    return hmac.new(secret, f"ddpfleet launch\n{launch}".encode(), hashlib.sha256).digest()


def _mac(key: bytes, name: str, body: bytes) -> bytes:
    return hmac.new(key, name.encode() + b"\n" + body, hashlib.sha256).hexdigest().encode()


def seal(key: bytes, name: str, value: dict) -> str:
    """The store value of key ``name``: ``value`` and its MAC under the launch's key."""
    mac = _mac(key, name, json.dumps(value, sort_keys=True).encode())
    return json.dumps({"mac": mac.decode(), "v": value}, sort_keys=True)


def _body(key: bytes, name: str, raw: bytes | str) -> bytes | None:
    """The value's JSON in ``raw`` when ``raw`` is sealed for ``name`` under ``key``: its size,
    layout and MAC checked, nothing parsed."""
    data = raw.encode() if isinstance(raw, str) else raw
    if not isinstance(data, bytes) or len(data) > MAX_VALUE:
        return None
    start = len(_HEAD) + _MAC_HEX + len(_MID)
    if not (data.startswith(_HEAD) and data.endswith(_TAIL) and len(data) > start):
        return None
    mac, body = data[len(_HEAD) : len(_HEAD) + _MAC_HEX], data[start : -len(_TAIL)]
    if data[len(_HEAD) + _MAC_HEX : start] != _MID:
        return None
    return body if hmac.compare_digest(_mac(key, name, body), mac) else None


def unseal(key: bytes, name: str, raw: bytes | str) -> dict | None:
    """The value sealed in ``raw`` for ``name`` under ``key``; None when it is not one, for
    whatever reason (a hostile value may raise anything: RecursionError for deep nesting)."""
    try:
        body = _body(key, name, raw)
        value = None if body is None else json.loads(body)
    except Exception:  # not a value, whatever went wrong
        return None
    return value if isinstance(value, dict) else None


def admits(key: bytes) -> Callable[[str, str, bytes | None], str]:
    """The store server's check (store_data.Admits): why it refuses ``op`` on key ``name``, or
    a value ``raw`` for it (None: no value), '' when it takes it."""

    def check(op: str, name: str, raw: bytes | None) -> str:
        if not KEY.fullmatch(name):
            return f"{name[:40]!r} is not a key the agents use"
        if op == "delete_key" and not name.startswith(DELETED):
            return f"{name} is not deleted by the agents"
        if raw is not None and _body(key, name, raw) is None:
            return f"the value of {name} is not sealed for this launch"
        return ""

    return check
