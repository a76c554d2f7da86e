"""What travels between the agents and their store (store.py): frames, and the values the
agents put in it (peers.py), sealed, of the shapes they must have to be acted on.

A request and its answer are each one frame, a 4-byte big-endian length and a JSON object. What
the server reads from a client is bounded in time and memory; what a client reads comes from the
run's own store. A value is ``{"mac": <hex>, "v": <the JSON value>}``: HMAC-SHA256 over the
key's name, a newline and the value's sorted JSON, under the run's secret bound to the launch
(``launch_key``), so an earlier launch's value, or another generation's (``@<g>`` in the name),
does not pass. Size, layout and MAC are checked before the JSON is parsed; what fails is None.
The store's server takes only this (``admits``): keys of ``KEY`` (from ``SHAPES``), deletes of
the keys agents delete (none they wait for), sealed values: a client without the secret can
neither fill the store, nor plant a value, nor take one away.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import socket
import time
from collections.abc import Callable

from ddpfleet_agent.ranks import COUNTS, NUMBERS, number

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


def receive(sock: socket.socket, hold: Callable[[int], None]) -> dict:
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
                hold(over)
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
        hold(-taken)


# What each key must hold to be acted on, as the agents write it: a value of another shape is
# ignored, and named once in the host's log, instead of raising in the supervision loop.
RANK_NUMBERS = (*COUNTS, *NUMBERS, "live_age", "progress_age")  # ranks.rank_views


def _is(kind: type) -> Callable[[object], bool]:
    return lambda value: type(value) is kind  # an int is not a bool (JSON makes no subclasses)


_int, _str = _is(int), _is(str)


def _none_or(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or check(value)


def _list_of(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: isinstance(value, list) and all(map(check, value))


def _fields(**checks: Callable[[object], bool]) -> Callable[[object], bool]:
    """A dict whose named fields pass their checks (other fields are free)."""
    return lambda value: (
        isinstance(value, dict) and all(check(value.get(name)) for name, check in checks.items())
    )


_number = _none_or(lambda value: number(value) is not None)
# each host's weight of the global batch (regrow.py): positive numbers
_weights = _none_or(
    lambda value: (
        isinstance(value, dict)
        and all(_str(h) and number(w) is not None and w > 0 for h, w in value.items())
    )
)
_rank_view = _fields(rank=_int, phase=_none_or(_str), **dict.fromkeys(RANK_NUMBERS, _number))
_failure = _fields(host=_str, reason=_str, rank=_none_or(_int), rebalance=_weights, speeds=_weights)
SHAPES: dict[str, Callable[[dict], bool]] = {
    "alive": _fields(count=_int),
    "ranks": _fields(state=_str, ranks=_list_of(_rank_view)),
    "exit": _fields(outcome=_str, host=_none_or(_str)),
    "failure": _failure,
    "stop": _fields(by=_str),
    "dumped": _fields(host=_str, ranks=_is(list)),
    "ready": _fields(host=_str),
    "join": _fields(host=_str, generation=_int),
    # joining: the hosts let back in at it; causes, attempts: the run's restarts and starts so
    # far (restarts.Starts), which the host let in adopts
    "welcome": _fields(
        generation=_int,
        nodes=_list_of(_int),
        joining=_none_or(_list_of(_int)),
        weights=_weights,
        causes=_none_or(_list_of(_failure)),
        attempts=_none_or(_list_of(_is(dict))),
    ),
    "leader": _fields(node=_int, generation=_int),
    "members": _fields(nodes=_list_of(_int), missing=_list_of(_int)),
}


# The keys agents use: a kind of SHAPES, then ``/<node rank>`` and ``@<generation>`` where the
# kind has them. Digits bounded: 5 for a node rank, 6 for a generation (restarts).
KEY = re.compile(rf"(?:{'|'.join(map(re.escape, SHAPES))})(?:/[0-9]{{1,5}})?(?:@[0-9]{{1,6}})?")

# A raw value's size cap, checked first: the largest value agents write, a 64-rank host's
# ``dumped/<n>``, is ~58 KB at its longest (test_wire.py); 1 MiB: ~1000 ranks a host.
MAX_VALUE = 1 << 20
DELETED = ("join/",)  # the only keys agents delete: a request answered (membership.welcome)
_SEALED = re.compile(rb'\{"mac": "(.{64})", "v": (.*)\}', re.DOTALL)  # seal()'s layout


def launch_key(secret: bytes, launch: str) -> bytes:
    """The key the values of one launch (``--attempt``) are sealed under."""
    return hmac.new(secret, f"ddpfleet launch\n{launch}".encode(), hashlib.sha256).digest()


def _mac(key: bytes, name: str, body: bytes) -> bytes:
    return hmac.new(key, name.encode() + b"\n" + body, hashlib.sha256).hexdigest().encode()


def seal(key: bytes, name: str, value: dict) -> str:
    """The store value of key ``name``: ``value`` and its MAC under the launch's key."""
    mac = _mac(key, name, json.dumps(value, sort_keys=True).encode())
    return json.dumps({"mac": mac.decode(), "v": value}, sort_keys=True)


def _body(key: bytes, name: str, raw: bytes | str) -> bytes | None:
    """The value's JSON in ``raw`` if sealed for ``name`` under ``key``; nothing parsed."""
    data = raw.encode() if isinstance(raw, str) else raw
    if not isinstance(data, bytes) or len(data) > MAX_VALUE:
        return None
    sealed = _SEALED.fullmatch(data)
    if sealed is None or not hmac.compare_digest(_mac(key, name, sealed[2]), sealed[1]):
        return None
    return sealed[2]


def unseal(key: bytes, name: str, raw: bytes | str) -> dict | None:
    """The value sealed in ``raw`` for ``name`` under ``key``; None when it is not one, for
    whatever reason (a hostile value may raise anything: RecursionError for deep nesting)."""
    try:
        body = _body(key, name, raw)
        value = None if body is None else json.loads(body)
    except Exception:  # not a value, whatever went wrong
        return None
    return value if isinstance(value, dict) else None


# why the store refuses a request (op, key, value: None but for set and compare_set), '' if not
Admits = Callable[[str, str, bytes | None], str]


def admits(key: bytes) -> Admits:
    """The store server's check: the agents' keys, deletes and sealed values only."""

    def check(op: str, name: str, raw: bytes | None) -> str:
        if not KEY.fullmatch(name):
            return f"{name[:40]!r} is not a key the agents use"
        if op == "delete_key" and not name.startswith(DELETED):
            return f"{name} is not deleted by the agents"
        if raw is not None and _body(key, name, raw) is None:
            return f"the value of {name} is not sealed for this launch"
        return ""

    return check
