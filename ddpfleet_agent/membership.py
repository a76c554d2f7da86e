"""Who is in the run: the hosts' regrouping at a restart, a host left out, a host taken back.

The half of ``peers.Peers`` that changes ``members`` (this generation's node ranks). At each
restart every agent says it is ready (``ready/<n>@<g>``); the store's host decides who starts
the next generation: those ready in time (``members@<g>``). A host left out that reaches the
store again asks to come back (``join/<n>``, naming the last generation it was in, so that a
copied request is not taken); the store's host lets it in at the next checkpoint: it ends the
generation (a claimed failure marked ``regrow``), tells the host which generation it joins
and with whom (``welcome/<n>``), and the hosts regroup with it. Values are sealed (peers.py).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ddpfleet_agent.store import StoreClient

if TYPE_CHECKING:
    from ddpfleet_agent.cli import AgentConfig
    from ddpfleet_agent.store import StoreServer

PROBE_S = 2.0  # how long a host looking for the run's store waits for one host's answer


class StoreLost(RuntimeError):
    """The connection to the run's store failed: its host counts as failed."""


class StoreGone(StoreLost):
    """The store refuses connections: node rank 0's agent has ended, and the run with it."""


class Membership:
    cfg: AgentConfig
    store: StoreClient | None
    server: StoreServer | None
    leader: int
    leads: bool
    address: Callable
    _shaped: Callable
    members: list[int]
    taken_back: dict[int, int]
    generation: int
    views: dict[int, dict]
    seen: dict[int, tuple[int, float]]
    started: float
    beats: int
    _broken: str
    # and, from Peers: _guarded(), _get(), _set(), _scoped(), _keepalive(), _call(), _open()
    _guarded: Callable
    _get: Callable
    _set: Callable
    _scoped: Callable
    _keepalive: Callable
    _call: Callable
    _open: Callable

    def regroup(
        self, generation: int, within: float, left_out: list[int], joining: list[int] | None = None
    ) -> dict:
        """Enter ``generation`` without the hosts ``left_out`` and with those ``joining``: say
        this host is ready (its ranks are gone) and keep its keepalive going until node rank 0
        says who starts it: the hosts ready within ``within`` s, once all are or that time is up
        (``members@<g>``: ``nodes``, and ``missing``, those that did not come). Returns that;
        ``members`` is its ``nodes`` from here, and the last generation's views are forgotten."""
        self.generation, self.views = generation, {}
        expected = sorted({n for n in self.members if n not in left_out} | set(joining or []))
        mine, decided = self._scoped(f"ready/{self.cfg.node_rank}"), self._scoped("members")
        self._guarded(lambda: self._set(mine, {"host": self.cfg.host}))
        deadline = time.time() + within

        def decision() -> dict | None:
            self._keepalive()
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
        now = time.time()  # the keepalives count again from here
        self.seen = {node: (count, now) for node, (count, _) in self.seen.items()}
        self.started = now
        self.members = list(said["nodes"])
        return said

    # --- a host left out, coming back -------------------------------------------------------
    def ran_before(self) -> bool:
        """This host's agent is new in a run an earlier agent of the host was part of (its
        container was started again): the store has the host's keepalive. The keepalive count
        goes on from that one (the others count a keepalive only when it grows), and an earlier
        answer to this host (``welcome/<n>``) is one the next must be newer than."""
        keys = (f"alive/{self.cfg.node_rank}", f"welcome/{self.cfg.node_rank}")
        alive, welcome = self._guarded(lambda: [self._get(k) for k in keys])  # type: ignore[misc]
        if alive is None:
            return False
        self.beats = int(alive["count"])
        self.generation = int(welcome["generation"]) if welcome else 0
        return True

    def reconnect(self) -> bool:
        """Connect to the run's store again (this host was cut off or left out, or its agent
        started again): the newest generation's of ``stores()``. False while none answers;
        StoreGone when every one refuses (the run is over)."""
        found = self.stores()
        if not found:
            return False
        self._drop()
        self.leader = max(found, key=lambda n: (found[n], -n))
        try:
            self._guarded(self._open)
        except StoreLost:
            return False
        return True

    def stores(self) -> dict[int, int]:
        """The stores the other hosts serve (node rank 0's alone without ``--addresses``) that
        hold a sealed ``leader`` record naming their own host: {node: its generation}.
        StoreGone when every one refuses (no agent of the run serves a store)."""
        found: dict[int, int] = {}
        others = [n for n in range(len(self.cfg.hosts)) if n != self.cfg.node_rank]
        candidates, refused = others if self.cfg.addresses else [0], 0
        for node in candidates:
            said = self._probe(node)
            refused += said == "refused"
            if isinstance(said, dict) and said["node"] == node:
                found[node] = said["generation"]
        if refused == len(candidates):
            raise StoreGone(f"no host of the run serves its store (port {self.cfg.store_port})")
        return found

    def _probe(self, node: int) -> dict | str | None:
        """The sealed ``leader`` record of the store at ``node``'s address; "refused" when
        nothing listens there, None when it does not answer or holds none."""
        address = (self.address(node), self.cfg.store_port)
        wait = min(PROBE_S, self.cfg.peer_timeout)
        try:
            socket.create_connection(address, timeout=wait).close()
        except ConnectionRefusedError:
            return "refused"
        except OSError:
            return None
        try:
            client = StoreClient(*address, wait)
        except OSError:
            return None
        try:
            raw = client.get("leader") if client.check(["leader"]) else None
        except (OSError, RuntimeError):
            return None
        finally:
            client.close()
        return self._shaped("leader", raw) if raw else None

    def _drop(self) -> None:
        """Close this agent's store (when it serves one) and its connection."""
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.store is not None:
            self.store.close()
            self.store = None
        self._broken = ""

    # --- the store's host lost: another host takes over (failover.py) -----------------------
    def take_over(self, generation: int) -> None:
        """Serve the run's store from this host, from ``generation`` on."""
        self._drop()
        self.leader, self.generation = self.cfg.node_rank, generation
        self._guarded(self._open)

    def follow(self, node: int, within: float, lost: int) -> None:
        """Connect to the store ``node``'s agent serves from now on (it took over), waiting up
        to ``within`` s (it may still be ending its ranks); StoreLost when none comes, or once
        ``lost``'s agent is found serving the run's store still: this host was the one cut
        off, and it looks for the run as a host left out does."""
        self._drop()
        self.leader, deadline = node, time.monotonic() + within
        while not isinstance(self._probe(node), dict):
            if time.monotonic() > deadline:
                raise StoreLost(f"no store at {self.address(node)} within {within:g}s")
            said = self._probe(lost)
            if isinstance(said, dict) and said["node"] == lost:
                raise StoreLost(
                    f"{self.cfg.hosts[lost]} serves the run's store: this host was cut off"
                )
            time.sleep(PROBE_S / 4)
        try:
            self.store = StoreClient(self.address(node), self.cfg.store_port, within)
        except OSError as exc:
            raise StoreLost(str(exc)) from None

    def step_down(self) -> None:
        """Stop serving the store: this host was cut off from every other, which go on under
        another's; it looks for the run's store as any host left out does (``reconnect``)."""
        self._drop()
        self.leader = -1

    def ask_to_join(self) -> None:
        key = f"join/{self.cfg.node_rank}"
        asked = {"host": self.cfg.host, "time": time.time(), "generation": self.generation}
        self._guarded(lambda: self._set(key, asked))

    def joins(self) -> list[int]:
        """Node rank 0: the hosts left out that asked to come back since they were last let in."""
        out = [n for n in range(len(self.cfg.hosts)) if n not in self.members]

        def asked(n: int) -> bool:
            """A request naming a generation not older than the host's last welcome: as this
            agent wrote it, or as the store has it (an older copy set over it does not count)."""
            request, answer = self._get(f"join/{n}"), self._get(f"welcome/{n}") or {}
            last = max(self.taken_back.get(n, 0), answer.get("generation", 0))
            return request is not None and request["generation"] >= last

        return self._guarded(lambda: [n for n in out if asked(n)])

    def welcome(self, generation: int, joining: list[int], weights: dict | None = None) -> None:
        """Node rank 0: tell the hosts ``joining`` the generation they start with, with whom
        and the hosts' ``weights`` (regrow.py); their requests are answered."""
        nodes = sorted({*self.members, *joining})

        def write() -> None:
            for n in joining:
                self.taken_back[n] = generation
                said = {"generation": generation, "nodes": nodes, "weights": weights}
                self._set(f"welcome/{n}", said)
                with contextlib.suppress(StoreLost):  # the answer counts; the request may stay
                    self._call(self.store.delete_key, f"join/{n}")  # type: ignore[union-attr]

        self._guarded(write)

    def welcomed(self) -> dict | None:
        """This host's answer, once node rank 0 let it back in: {generation, nodes}."""
        found = self._guarded(lambda: self._get(f"welcome/{self.cfg.node_rank}"))
        return found if found and found["generation"] > self.generation else None

    def run_over(self) -> bool:
        """The store's host's agent has reported its exit: no generation is to come."""
        return self._guarded(lambda: self._get(f"exit/{self.leader}")) is not None
