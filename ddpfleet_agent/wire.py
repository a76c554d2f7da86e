"""What the agents put in their store: the shape each key must have to be acted on, and the
seal that proves an agent of this run wrote it (``ddpfleet_agent.peers`` reads and writes them).

A value is ``{"v": <the JSON value>, "mac": <hex>}``, the MAC being HMAC-SHA256 under the run's
secret (``agent.key``) over the key's name, a newline and the value's JSON with sorted keys.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable

from ddpfleet_agent.ranks import number

# What each key must hold to be acted on, as the agents write it (``Agent._record``,
# ``Agent._failure``, ``request_stop``, ``Agent._finish``). Every agent reads every key each
# round: a value of another shape (a store client that is not an agent) is ignored, and named
# once in the host's log, instead of raising in the supervision loop.
RANK_NUMBERS = (
    "step", "total_steps", "epoch", "live_age", "progress_age", "loss", "images_per_sec",
    "batch", "micro_batches", "saved",
)  # fmt: skip


def _number(value: object) -> bool:
    return value is None or number(value) is not None


def _text(value: object) -> bool:
    return value is None or isinstance(value, str)


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
    ),
    "stop": lambda v: isinstance(v.get("by"), str),
    "dumped": lambda v: isinstance(v.get("host"), str) and isinstance(v.get("ranks"), list),
    "ready": lambda v: isinstance(v.get("host"), str),
    "join": lambda v: isinstance(v.get("host"), str),
    "welcome": lambda v: (
        type(v.get("generation")) is int
        and isinstance(v.get("nodes"), list)
        and all(type(n) is int for n in v["nodes"])
    ),
    "leader": lambda v: type(v.get("node")) is int and type(v.get("generation")) is int,
    "members": lambda v: all(
        isinstance(v.get(k), list) and all(type(n) is int for n in v[k])
        for k in ("nodes", "missing")
    ),
}


def _mac(key: bytes, name: str, body: str) -> str:
    return hmac.new(key, f"{name}\n{body}".encode(), hashlib.sha256).hexdigest()


def seal(key: bytes, name: str, value: dict) -> str:
    """The store value of key ``name``: ``value`` and its MAC under the run's secret."""
    mac = _mac(key, name, json.dumps(value, sort_keys=True))
    return json.dumps({"v": value, "mac": mac}, sort_keys=True)


def unseal(key: bytes, name: str, raw: bytes | str) -> dict | None:
    """The value sealed in ``raw`` for ``name`` under ``key``; None when it is not one."""
    try:
        outer = json.loads(raw)
    except (ValueError, UnicodeDecodeError, TypeError):
        return None
    if not isinstance(outer, dict) or not isinstance(outer.get("mac"), str):
        return None
    value = outer.get("v")
    if not isinstance(value, dict):
        return None
    want = _mac(key, name, json.dumps(value, sort_keys=True))
    return value if hmac.compare_digest(want, outer["mac"]) else None
