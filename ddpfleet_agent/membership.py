"""The agent's connection to the run's store, and who is in the run: the base of peers.Peers.

Each store call waits at most ``peer_timeout`` (``_guarded``); a store that fails is
``StoreLost``. A value read is sealed for its key (wire.py) and of the shape agents write, or it
is ignored and named once in the host's log.

``members`` are this generation's node ranks. At a restart every agent says it is ready
(``ready/<n>@<g>``), and the store's host names those ready in time (``members@<g>``). A host
left out that reaches the store again asks to come back (``join/<n>``, naming the last
generation it was in: a copied request is not taken); the store's host ends the generation at
the next checkpoint, tells the host which one it joins and with whom (``welcome/<n>``), and the
hosts regroup with it.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable

from ddpfleet_agent.cli import AgentConfig
from ddpfleet_agent.files import call_within
from ddpfleet_agent.store import StoreClient, StoreError, StoreServer
from ddpfleet_agent.wire import SHAPES, admits, seal, unseal


class StoreLost(RuntimeError):
    """The connection to the run's store failed: its host counts as failed."""


class CutOff(StoreLost):
    """The lost store's host serves it still: this host was the one cut off (failover.py)."""


class StoreGone(StoreLost):
    """The store refuses connections: node rank 0's agent has ended, and the run with it."""


def _lost(exc: BaseException) -> StoreLost:
    return StoreLost(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


class Membership:
    def __init__(self, cfg: AgentConfig, note: Callable[[str], None]):
        """``note``: says a line once per key whose value is ignored (the agent's log)."""
        self.cfg, self.note = cfg, note
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
        self.members = list(range(len(cfg.hosts)))
        self.taken_back: dict[int, int] = {}  # the store's host: host -> generation it was let into
        self.leader = 0  # the node rank whose agent serves the store (failover.py); -1: unknown

    @property
    def leads(self) -> bool:
        """This host's agent serves the store and decides for the run (node rank 0's first)."""
        return self.leader == self.cfg.node_rank

    def address(self, node: int) -> str:
        """The cluster address of a host (node rank 0's is --store's without --addresses)."""
        return self.cfg.addresses[node] if self.cfg.addresses else self.cfg.store_host

    def _scoped(self, key: str) -> str:
        """The key of this generation (the first one's have no suffix)."""
        return f"{key}@{self.generation}" if self.generation else key

    def _guarded(self, fn: Callable[[], object]) -> object:
        """fn() on a daemon thread, waited for at most peer_timeout: a peer cut off by dropped
        packets leaves a socket read blocked far longer than the store's own timeout."""
        if self._broken:
            raise StoreLost(self._broken)

        def call() -> tuple[object, BaseException | None]:
            try:
                return fn(), None
            except BaseException as exc:  # handed to the caller's thread below
                return None, exc

        if not (done := call_within(call, self.cfg.peer_timeout)):
            self._broken = f"no answer from the store for {self.cfg.peer_timeout:.0f}s"
            raise StoreLost(self._broken)
        value, error = done[0]
        if error is not None:
            raise error
        return value

    def _open(self, timeout: float = 0.0) -> None:
        """A new connection to the store (calls wait ``timeout``, else peer_timeout); its host's
        agent serves it first, once, with the ``leader`` record that hosts looking for it read."""
        host, port = self.address(self.leader), self.cfg.store_port
        try:
            if serve := self.leads and self.server is None:
                self.server = StoreServer(host, port, admits(self.key))
            if self.store is not None:
                self.store.close()
            self.store = StoreClient(host, port, timeout or self.cfg.peer_timeout)
        except OSError as exc:
            raise _lost(exc) from None
        if serve:
            self._set("leader", {"node": self.cfg.node_rank, "generation": self.generation})

    def _call(self, op: str, *args):
        """The store's ``op``; None when it refuses (said once per key)."""
        if self.store is None:
            raise StoreLost("not connected")
        try:
            return getattr(self.store, op)(*args)
        except StoreError as exc:  # full, or a key refused: the run goes on without this write
            if (said := f"refused {args[0]}") not in self.ignored:
                self.ignored.add(said)
                self.note(f"the store {said}: {exc}")
            return None
        except TimeoutError:  # the socket's, which may end the wait before _guarded's does
            raise StoreLost(f"no answer from the store for {self.cfg.peer_timeout:.0f}s") from None
        except (RuntimeError, OSError) as exc:
            raise _lost(exc) from None

    def _get(self, key: str) -> dict | None:
        return self._shaped(key, self._call("get", key))  # None for a missing key too

    def _shaped(self, key: str, raw: bytes | str | None) -> dict | None:
        """The value of key if sealed with the run's key and of a shape agents write, else None
        (noted once)."""
        value = unseal(self.key, key, raw) if raw else None
        if value is not None and SHAPES[re.split("[/@]", key, maxsplit=1)[0]](value):
            return value
        if raw and key not in self.ignored:
            why = "not signed with the run's key" if value is None else "not what an agent writes"
            self.ignored.add(key)
            self.note(f"ignored the store's {key}: {why} ({repr(raw)[:200]})")
        return None

    def _set(self, key: str, value: dict) -> None:
        self._call("set", key, seal(self.key, key, value))

    def regroup(
        self, generation: int, within: float, left_out: list[int], joining: list[int] | None = None
    ) -> dict:
        """Enter ``generation`` without the hosts ``left_out``, with those ``joining``: say this
        host is ready (its ranks are gone) until the store's host names those ready within
        ``within`` s (all, or those at that time): returns ``members@<g>`` {nodes, missing}."""
        self.generation, self.views = generation, {}
        expected = sorted({n for n in self.members if n not in left_out} | set(joining or []))
        mine, decided = self._scoped(f"ready/{self.cfg.node_rank}"), self._scoped("members")
        self._guarded(lambda: self._set(mine, {"host": self.cfg.host}))
        deadline = time.time() + within

        def decision() -> dict | None:
            self.beats += 1  # the keepalive goes on (Peers.seen)
            self._set(f"alive/{self.cfg.node_rank}", {"count": self.beats})
            if not self.leads:
                return self._get(decided)
            ready = [n for n in expected if self._get(self._scoped(f"ready/{n}")) is not None]
            if len(ready) < len(expected) and time.time() <= deadline:
                return None
            said = {"nodes": ready, "missing": [n for n in expected if n not in ready]}
            self._set(decided, said)
            self._set("leader", {"node": self.cfg.node_rank, "generation": generation})
            return said

        while (said := self._guarded(decision)) is None:
            if time.time() > deadline + self.cfg.peer_timeout:
                raise StoreLost(f"the store's host did not say who restarts within {within:.0f}s")
            time.sleep(self.cfg.tick)
        now = self.started = time.time()  # the keepalives count again from here
        self.seen = {node: (count, now) for node, (count, _) in self.seen.items()}
        self.members = list(said["nodes"])  # type: ignore[index]
        return said  # type: ignore[return-value]

    def _drop(self, leader: int) -> None:
        """Close this agent's store (when it serves one) and its connection: ``leader``'s next."""
        for held in (self.server, self.store):
            if held is not None:
                held.close()
        self.server = self.store = None
        self._broken, self.leader = "", leader

    def ask_to_join(self) -> None:
        asked = {"host": self.cfg.host, "time": time.time(), "generation": self.generation}
        self._guarded(lambda: self._set(f"join/{self.cfg.node_rank}", asked))

    def joins(self) -> list[int]:
        """Node rank 0: the hosts left out that asked to come back since last let in: naming a
        generation not older than their last welcome as this agent wrote it or the store has
        it (an older copy of a request set over it does not count)."""
        out = [n for n in range(len(self.cfg.hosts)) if n not in self.members]

        def asked(n: int) -> bool:
            request, answer = self._get(f"join/{n}"), self._get(f"welcome/{n}") or {}
            last = max(self.taken_back.get(n, 0), answer.get("generation", 0))
            return request is not None and request["generation"] >= last

        return self._guarded(lambda: [n for n in out if asked(n)])  # type: ignore[return-value]

    def welcome(
        self,
        generation: int,
        joining: list[int],
        weights: dict | None = None,
        run: dict | None = None,
    ) -> None:
        """Node rank 0: tell the hosts ``joining`` the generation they start with, with whom,
        which of them come back, the hosts' ``weights`` (regrow.py), and the run's restarts and
        starts so far (``run``: restarts.Starts.record); their requests are answered."""
        said = {"generation": generation, "nodes": sorted({*self.members, *joining}),
                "joining": sorted(joining), **(run or {})}  # fmt: skip

        def write() -> None:
            for n in joining:
                self.taken_back[n] = generation
                self._set(f"welcome/{n}", {**said, "weights": weights})
                with contextlib.suppress(StoreLost):  # the answer counts; the request may stay
                    self._call("delete_key", f"join/{n}")

        self._guarded(write)

    def welcomed(self) -> dict | None:
        """This host's answer, once node rank 0 let it back in: {generation, nodes}; the
        members are then the hosts it named."""
        found = self._guarded(lambda: self._get(f"welcome/{self.cfg.node_rank}"))
        if not (found and found["generation"] > self.generation):  # type: ignore[index]
            return None
        self.members = list(found["nodes"])  # type: ignore[index]
        return found  # type: ignore[return-value]
