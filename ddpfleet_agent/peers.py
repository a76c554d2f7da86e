"""The other hosts' agents, over the run's store (store.py, served by node rank 0's agent).

Keys: ``alive/<n>`` keepalive count, ``ranks/<n>`` the host's rank views (with the failed
exit it saw, ``cause``, once its command failed), ``failure`` the first failure claimed
(compare-and-set), ``stop`` a requested stop, ``exit/<n>`` how a host's command ended,
``dumped/<n>`` the host's forensics record of a failed run (bundle.py), ``ready/<n>`` the host
back from a failure and ready to restart. A run restarted in place (``--restarts``) is a new
generation, of the hosts still in it (``members``: a host gone is left out when the run may
shrink): its ``ranks``, ``failure``, ``dumped`` and ``ready`` keys end in ``@<generation>``
(sealed under that name: an earlier generation's value does not pass for one of this), the
keepalive, ``stop`` and ``exit`` keys are the run's. Ages are measured by each host on its own
clock, so clocks need not agree.

The store takes any client on the cluster network, so every value is sealed: an HMAC-SHA256
over the key's name and the JSON value, under the run's secret (``--key-file``, root's and the
storage owner's alone) bound to the launch (wire.launch_key); the store serves only such values
(wire.admits). What fails the check, or has another shape than agents write, is ignored and
named once in the host's log. A keepalive counts only when its count grows: a value seen
before, sent again, keeps no host alive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from ddpfleet_agent.cli import AgentConfig
from ddpfleet_agent.membership import Membership, StoreLost
from ddpfleet_agent.store import StoreClient, StoreError, StoreServer
from ddpfleet_agent.wire import SHAPES, admits, launch_key, seal, unseal


class Peers(Membership):
    def __init__(self, cfg: AgentConfig, note: Callable[[str], None]):
        """``note``: says a line once per key whose value is ignored (the agent's log)."""
        self.cfg = cfg
        self.note = note
        self.n = len(cfg.hosts)
        self.store: StoreClient | None = None
        self.server: StoreServer | None = None  # node rank 0's, once it serves
        self.seen: dict[int, tuple[int, float]] = {}  # node -> (keepalive count, local time)
        self.views: dict[int, dict] = {}
        self.exits: dict[int, dict] = {}
        self.started = time.time()
        self._broken = ""
        self.ignored: set[str] = set()  # keys whose value was ignored (said once each)
        self.key = b""
        self.beats = 0  # this host's keepalive count
        self.generation = 0  # starts of the command before this one's (restarts.py)
        self.members = list(range(self.n))  # the node ranks of this generation's hosts
        self.taken_back: dict[int, int] = {}  # the store's host: host -> generation it was let into
        self.leader = 0  # the node rank whose agent serves the store (failover.py); -1: unknown

    @property
    def leads(self) -> bool:
        """This host's agent serves the run's store: it decides for the run and writes its
        records (node rank 0's, until another host took over)."""
        return self.leader == self.cfg.node_rank

    def address(self, node: int) -> str:
        """The cluster address of a host (node rank 0's is --store's without --addresses)."""
        return self.cfg.addresses[node] if self.cfg.addresses else self.cfg.store_host

    def _scoped(self, key: str) -> str:
        """The key of this generation (the first one's have no suffix)."""
        return f"{key}@{self.generation}" if self.generation else key

    def _guarded(self, fn: Callable[[], object]) -> object:
        """Run fn on a daemon thread, waiting at most peer_timeout: a peer cut off by dropped
        packets leaves a socket read blocked far longer than the store's own timeout (and a
        daemon thread left blocked does not keep the agent from exiting)."""
        if self._broken:
            raise StoreLost(self._broken)
        box: dict[str, object] = {}

        def call() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller's thread below
                box["error"] = exc

        worker = threading.Thread(target=call, daemon=True, name="store")
        worker.start()
        worker.join(self.cfg.peer_timeout)
        if worker.is_alive():
            self._broken = f"no answer from the store for {self.cfg.peer_timeout:.0f}s"
            raise StoreLost(self._broken)
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box.get("value")

    def connect(self) -> None:
        """Read the run's secret, then connect to the store (its host's agent serves it)."""
        self.read_key()
        self._open()

    def read_key(self) -> None:
        """Read the run's secret (at most peer_timeout: it is on the shared storage)."""
        path = Path(self.cfg.key_file)
        try:
            self.key = self._guarded(lambda: path.read_bytes().strip())  # type: ignore[assignment]
        except OSError as exc:
            raise StoreLost(f"cannot read the run's key {path}: {exc.strerror}") from None
        except StoreLost:
            why = f"the run's key {path} did not read in {self.cfg.peer_timeout:.0f}s"
            raise StoreLost(why) from None
        if len(self.key) < 32:
            raise StoreLost(f"the run's key {path} is shorter than 32 bytes")
        self.key = launch_key(self.key, self.cfg.attempt)  # an earlier launch's values: unsealed

    def _open(self) -> None:
        """A new connection to the store (its host's agent: serve it first, once, with the
        sealed ``leader`` record that tells a host looking for the run's store it is this)."""
        host, port = self.address(self.leader), self.cfg.store_port
        try:
            serve = self.leads and self.server is None
            if serve:
                self.server = StoreServer(host, port, admits(self.key))
            if self.store is not None:
                self.store.close()
            self.store = StoreClient(host, port, self.cfg.peer_timeout)
        except OSError as exc:
            raise StoreLost(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        if serve:
            self._set("leader", {"node": self.cfg.node_rank, "generation": self.generation})

    def _call(self, fn, *args):
        if self.store is None:
            raise StoreLost("not connected")
        try:
            return fn(*args)
        except StoreError as exc:  # full, or a key refused: the run goes on without this write
            if (said := f"refused {args[0]}") not in self.ignored:
                self.ignored.add(said)
                self.note(f"the store {said}: {exc}")
            return None
        except TimeoutError:  # the socket's, which may end the wait before _guarded's does
            raise StoreLost(f"no answer from the store for {self.cfg.peer_timeout:.0f}s") from None
        except (RuntimeError, OSError) as exc:
            raise StoreLost(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None

    def _get(self, key: str) -> dict | None:
        assert self.store is not None
        if not self._call(self.store.check, [key]):
            return None
        raw = self._call(self.store.get, key)
        return self._shaped(key, raw)

    def _shaped(self, key: str, raw: bytes | str) -> dict | None:
        """The value of key when it is sealed with the run's key and has the shape agents
        write, else None (noted once)."""
        value = unseal(self.key, key, raw) if raw else None
        why = "not signed with the run's key"
        if value is not None:
            if SHAPES[key.split("/", maxsplit=1)[0].split("@", maxsplit=1)[0]](value):
                return value
            why = "not what an agent writes"
        if raw and key not in self.ignored:
            self.ignored.add(key)
            self.note(f"ignored the store's {key}: {why} ({repr(raw)[:200]})")
        return None

    def _set(self, key: str, value: dict) -> None:
        assert self.store is not None
        self._call(self.store.set, key, seal(self.key, key, value))

    def exchange(self, record: dict) -> tuple[dict | None, dict | None]:
        """Publish this host's record and keepalive; read every host's. Returns (failure, stop).

        What the store says is applied here, on the caller's thread: a store call that outlived
        its guard (a host cut off) may still return on its own thread, long after, and must not
        set a peer's last keepalive to the time it began (seen after a reconnect: a live peer
        judged silent)."""
        mine, claimed = self._scoped(f"ranks/{self.cfg.node_rank}"), self._scoped("failure")
        views = {node: self._scoped(f"ranks/{node}") for node in self.members}
        exits = [n for n in self.members if n not in self.exits]
        beat = self._next_beat()
        got = self._guarded(lambda: self._exchange(mine, record, beat, views, exits, claimed))
        now = time.time()
        for node, count in got["alive"].items():  # type: ignore[index]
            if count > self.seen.get(node, (0, now))[0]:  # grown: a value sent again is stale
                self.seen[node] = (count, now)
        self.views.update(got["views"])  # type: ignore[index]
        self.exits.update(got["exits"])  # type: ignore[index]
        return got["failure"], got["stop"]  # type: ignore[index]

    def _exchange(  # noqa: PLR0917 - what exchange() worked out before the call
        self, mine: str, record: dict, beat: int, views: dict, exits: list, claimed: str
    ) -> dict:
        """The store's side of exchange(), on the guard's thread: writes and reads, no state."""
        self._set(mine, record)
        self._set(f"alive/{self.cfg.node_rank}", {"count": beat})
        alive = {n: (self._get(f"alive/{n}") or {}).get("count", 0) for n in views}
        got_views = {n: v for n, key in views.items() if (v := self._get(key)) is not None}
        got_exits = {n: v for n in exits if (v := self._get(f"exit/{n}")) is not None}
        return {"alive": alive, "views": got_views, "exits": got_exits,
                "failure": self._get(claimed), "stop": self._get("stop")}  # fmt: skip

    def _next_beat(self) -> int:
        self.beats += 1
        return self.beats

    def _keepalive(self) -> None:
        """This host's keepalive: a count that grows with each call (Peers.seen)."""
        self._set(f"alive/{self.cfg.node_rank}", {"count": self._next_beat()})

    def exit_causes(self) -> list[dict]:
        """The failed exits the other hosts' agents published (their ``cause``), as last read."""
        causes = [v.get("cause") for n, v in self.views.items() if n != self.cfg.node_rank]
        return [c for c in causes if isinstance(c, dict) and SHAPES["failure"](c)]

    def silent(self, now: float, after: float) -> list[int]:
        """Other hosts without a keepalive for `after` seconds (since start when never seen),
        leaving out those that reported their exit."""
        others = [n for n in self.members if n != self.cfg.node_rank and n not in self.exits]
        return [n for n in others if now - self.seen.get(n, (0, self.started))[1] > after]

    def claim(self, failure: dict) -> dict:
        """Put failure into the store unless one is there; returns the one that counts."""
        assert self.store is not None
        key = self._scoped("failure")
        mine = seal(self.key, key, failure)
        won = self._guarded(lambda: self._call(self.store.compare_set, key, "", mine))
        claimed = self._shaped(key, won)
        if claimed is None:  # what held the key is no failure: this one replaces it
            self._guarded(lambda: self._call(self.store.set, key, mine))
            return failure
        return claimed

    def request_stop(self, by: str) -> None:
        assert self.store is not None
        stop = seal(self.key, "stop", {"by": by, "time": time.time()})
        self._guarded(lambda: self._call(self.store.compare_set, "stop", "", stop))

    def publish_dump(self, record: dict) -> None:
        """This host's forensics record (bundle.py): its ranks' locations, no stacks."""
        self._guarded(lambda: self._set(self._scoped(f"dumped/{self.cfg.node_rank}"), record))

    def dumps(self) -> dict[int, dict]:
        """node -> the forensics record its agent published, for those that did."""
        got = self._guarded(
            lambda: {n: self._get(self._scoped(f"dumped/{n}")) for n in self.members}
        )
        return {n: v for n, v in got.items() if v is not None}  # type: ignore[union-attr]

    def report_exit(self, record: dict) -> None:
        self._guarded(lambda: self._set(f"exit/{self.cfg.node_rank}", record))
