"""Random frames and values thrown at the store of real agents (conftest.Cluster) while they run:
bad JSON, deep nesting, huge and false lengths, wrong types, unsigned and replayed values and
deletes under every key pattern the agents use, half-sent frames and many idle connections. The
run completes. Seeded: the seed is printed, and DDPFLEET_FUZZ_SEED=<seed> throws the same again."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import socket
import threading
import time

from ddpfleet_agent.store import StoreClient
from ddpfleet_agent.wire import SHAPES

THROW_S = 8.0  # seconds of throwing, while the agents run (~20 s in all with their start and end)
IDLE = 100  # connections opened and left idle, of the store's 256


def _keys() -> list[str]:
    kinds = sorted(SHAPES)
    return [f"{k}{n}{g}" for k in kinds for n in ("", "/0", "/1") for g in ("", "@0", "@1")]


def _junk(rng: random.Random) -> object:
    """A JSON value of a random type, or something that is not JSON at all."""
    return rng.choice([
        lambda: "[" * rng.randrange(1, 300000),
        lambda: "{" * rng.randrange(1, 1000) + '"a":' * rng.randrange(1, 100),
        lambda: rng.randbytes(rng.randrange(0, 2000)),
        lambda: json.dumps({"mac": "0" * 64, "v": {"by": "fuzz", "count": 10**9}}),
        lambda: json.dumps({"v": {"host": "h1", "reason": "x", "rank": 1}, "mac": rng.random()}),
        lambda: rng.choice([None, 0, -1, 2**70, 1.5, True, [], {}, "", "x" * 70000]),
    ])()  # fmt: skip


def _frame(rng: random.Random) -> bytes:
    """Bytes a client might send: a frame or part of one, its length true or not."""
    kind = rng.randrange(6)
    if kind == 0:
        body = rng.randbytes(rng.randrange(0, 5000))
    elif kind == 1:
        body = b"[" * rng.randrange(1000, 300000)
    elif kind == 2:  # a request of the right keys with values of the wrong types
        op = rng.choice(["set", "get", "check", "compare_set", "delete_key", "flush", 7, None])
        req = {"op": op, "key": _junk(rng), "keys": _junk(rng), "value": _junk(rng),
               "expected": _junk(rng), "desired": _junk(rng)}  # fmt: skip
        body = json.dumps(req, default=lambda b: base64.b64encode(b).decode()).encode()
    else:
        body = json.dumps(_junk(rng), default=lambda b: b.hex()).encode()
    size = rng.choice([len(body), len(body), 0, 2**32 - 1, 4 << 20, rng.randrange(2**32)])
    return size.to_bytes(4, "big") + body[: rng.randrange(0, len(body) + 1)]


def _throw_frames(port: int, rng: random.Random, until: float) -> None:
    while time.monotonic() < until:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 2) as s:
            s.sendall(_frame(rng))
            s.settimeout(0.05)
            with contextlib.suppress(OSError):
                s.recv(1 << 16)
        time.sleep(0.01)


def _throw_values(port: int, rng: random.Random, until: float) -> None:
    keys, client = _keys(), StoreClient("127.0.0.1", port, 5)
    while time.monotonic() < until:
        key, value = rng.choice(keys), _junk(rng)
        raw = value if isinstance(value, bytes) else str(value).encode()
        with contextlib.suppress(Exception):  # refused: StoreError, and sometimes OSError
            if rng.random() < 0.1:
                client.delete_key(key)  # refused but for join/<n>: none that agents wait for
            elif rng.random() < 0.3 and (seen := client.get(rng.choice(keys))) is not None:
                client.set(key, seen)  # a sealed value copied, set again (maybe elsewhere)
            elif rng.random() < 0.5:
                client.set(key, raw)
            else:
                client.compare_set(key, rng.choice([b"", raw]), raw)
        time.sleep(0.005)
    client.close()


def _hold(port: int, rng: random.Random, held: list[socket.socket]) -> None:
    """IDLE connections left idle, a third of them after sending part of a frame."""
    for i in range(IDLE):
        with contextlib.suppress(OSError):
            s = socket.create_connection(("127.0.0.1", port), 2)
            if i % 3 == 0:
                s.sendall((4 << 20).to_bytes(4, "big") + rng.randbytes(rng.randrange(1, 200000)))
            held.append(s)


def test_a_run_completes_whatever_the_network_throws_at_its_store(cluster) -> None:
    seed = int(os.environ.get("DDPFLEET_FUZZ_SEED") or time.time_ns() % 2**32)
    print(f"fuzz seed {seed} (DDPFLEET_FUZZ_SEED={seed} to run it again)")
    c = cluster(2)
    c.start({0: "run:14", 1: "run:14"})
    c.heartbeat_ready(0, step=0.5)
    until = time.monotonic() + THROW_S
    held: list[socket.socket] = []
    throwers = [
        threading.Thread(target=_throw_frames, args=(c.port, random.Random(seed), until)),
        threading.Thread(target=_throw_values, args=(c.port, random.Random(seed + 1), until)),
        threading.Thread(target=_hold, args=(c.port, random.Random(seed + 2), held)),
    ]
    for t in throwers:
        t.start()
    try:
        for t in throwers:
            t.join(THROW_S + 20)
        codes = c.wait(40)
    finally:
        for s in held:
            s.close()
    assert codes == [0, 0], f"seed {seed}\n{c.output()}"
    assert c.json("progress.json")["status"] == "completed", seed
    for host in c.hosts:
        assert "failure" not in c.json(f"nodes/{host}.exit"), seed
        log = (c.run_dir / "nodes" / f"{host}.log").read_text()
        assert "Traceback" not in log, f"seed {seed}\n{log}"
