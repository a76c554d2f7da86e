"""The keys and values of the agents' store (store.py), and the memory they take.

At most ``MAX_BYTES`` in all, counted as Python holds them: each entry's key and value objects
(``sys.getsizeof``) and its share of the dictionary (``ENTRY``). Replacing a value with one no
larger always succeeds: a full store never refuses an agent's rewrite of its own key. A server
given ``admits`` (wire.admits) refuses what it does not take, so a client without the run's
secret cannot fill it.
"""

from __future__ import annotations

import base64
import sys
import threading
from collections.abc import Callable

MAX_BYTES = 64 << 20  # memory the keys and values take in all
# A dictionary's own memory per entry, on top of its key and value: 8 bytes of index and 24 of
# entry, in tables up to ~2x the entries right after they grow (38 bytes an entry measured at
# 100000 entries with tracemalloc, CPython 3.11), and pymalloc's rounding of key and value.
ENTRY = 96
# why the server refuses a request (op, key, value: None but for set and compare_set), '' if not
Admits = Callable[[str, str, bytes | None], str]


class StoreError(RuntimeError):
    """The server refused the request (its ``error``)."""


def encode(value: bytes | str | None) -> str | None:
    if isinstance(value, str):
        value = value.encode()
    return None if value is None else base64.b64encode(value).decode("ascii")


def decode(text: object) -> bytes:
    """``text`` as JSON gave it: TypeError when not a string (JSON gives no bytes)."""
    try:
        return base64.b64decode(text, validate=True)  # type: ignore[arg-type]
    except (ValueError, TypeError):  # binascii.Error is a ValueError, as is non-ASCII text
        raise StoreError("a value must be a base64 string") from None


def cost(key: str, value: bytes) -> int:
    """Bytes of memory one entry takes in the store."""
    return sys.getsizeof(key) + sys.getsizeof(value) + ENTRY


class Data:
    """The store's keys and values, under one lock; ``admits``: what the server takes."""

    def __init__(self, admits: Admits | None = None) -> None:
        self.values: dict[str, bytes] = {}
        self.size = 0
        self.lock = threading.Lock()
        self.admits = admits

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
