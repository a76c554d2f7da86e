"""The keys and values of the agents' store (store.py), and what they cost the serving process.

The store holds at most ``MAX_BYTES`` of memory in keys and values, counted as Python holds
them: each entry's key and value objects (``sys.getsizeof``) and its share of the dictionary
(``ENTRY``), not only their bytes (~90 bytes an entry short before). Replacing a value with one
no larger always succeeds, so a full store never refuses an agent's rewrite of its own key. A
server given ``admits`` (wire.admits: the agents' key patterns, values sealed for the launch)
refuses what it does not take, so a client without the run's secret cannot fill it at all.
"""

from __future__ import annotations

import base64
import binascii
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


def encode(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode("ascii")


def decode(text: object) -> bytes:
    if not isinstance(text, str):
        raise StoreError("a value must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
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

    def _put(self, key: str, value: bytes) -> None:
        old = self.values.get(key)
        grown = cost(key, value) - (cost(key, old) if old is not None else 0)
        if grown > 0 and self.size + grown > MAX_BYTES:
            raise StoreError(f"the store is full ({MAX_BYTES} bytes)")
        self.values[key] = value
        self.size += grown

    def apply(self, req: dict) -> dict:
        op = req.get("op")
        keys = req.get("keys") if op == "check" else [req.get("key")]
        named = isinstance(keys, list) and all(isinstance(k, str) and k for k in keys)
        if not (keys and named):
            raise StoreError("keys must be non-empty strings")
        key, value = keys[0], None
        if op in ("set", "compare_set"):
            value = decode(req.get("value" if op == "set" else "desired"))
        # checked before the lock: a MAC over a value of up to 1 MiB keeps no other call waiting
        refused = [why for k in keys if self.admits and (why := self.admits(str(op), k, value))]
        if refused:
            raise StoreError(refused[0])
        with self.lock:
            if op == "set" and value is not None:
                self._put(key, value)
                return {}
            if op == "get":
                return {"value": encode(self.values.get(key))}
            if op == "check":
                return {"found": all(k in self.values for k in keys)}
            if op == "compare_set" and value is not None:
                # c10d's meaning: a missing key counts as the empty value only
                expected, current = decode(req.get("expected")), self.values.get(key)
                if current == expected or (current is None and not expected):
                    self._put(key, value)
                    return {"value": encode(value)}
                return {"value": encode(current if current is not None else expected)}
            if op == "delete_key":
                old = self.values.pop(key, None)
                if old is not None:
                    self.size -= cost(key, old)
                return {"deleted": old is not None}
        raise StoreError(f"unknown op {op!r}")
