"""The other hosts' agents, over the run's store (store.py, served by node rank 0's agent).

Keys: ``alive/<n>`` keepalive count, ``ranks/<n>`` the host's rank views (with ``cause``, the
failed exit it saw), ``failure`` the first failure claimed (compare-and-set), ``stop`` a
requested stop, ``exit/<n>`` how a host's command ended, ``dumped/<n>`` its forensics record
(bundle.py), ``ready/<n>`` the host ready to restart. In a generation after the first
(membership.py) the ``ranks``, ``failure``, ``dumped`` and ``ready`` keys end in ``@<g>``.
Every value is sealed under the run's secret (``--key-file``) bound to the launch (wire.py): the
store takes any client on the cluster network. Ages are measured on each host's own clock, and
a keepalive counts only when its count grows: a value sent again keeps no host alive.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

from ddpfleet_agent.membership import CutOff, Membership, StoreGone, StoreLost
from ddpfleet_agent.store import StoreClient
from ddpfleet_agent.wire import SHAPES, launch_key, seal

PROBE_S = 2.0  # how long a host looking for the run's store waits for one host's answer


class Peers(Membership):
    def connect(self) -> None:
        """Connect to the store (its host's agent serves it), once ``read_key`` read the key."""
        self._open()

    def read_key(self) -> None:
        """Read the run's secret (at most peer_timeout: it is on the shared storage)."""
        path = Path(self.cfg.key_file)
        try:
            secret: bytes = self._guarded(lambda: path.read_bytes().strip())  # type: ignore[assignment]
        except OSError as exc:
            raise StoreLost(f"cannot read the run's key {path}: {exc.strerror}") from None
        except StoreLost:
            why = f"the run's key {path} did not read in {self.cfg.peer_timeout:.0f}s"
            raise StoreLost(why) from None
        if len(secret) < 32:
            raise StoreLost(f"the run's key {path} is shorter than 32 bytes")
        self.key = launch_key(secret, self.cfg.attempt)  # an earlier launch's values: unsealed

    def ran_before(self) -> bool:
        """An earlier agent of this host was in the run (its container started again): the
        store has its keepalive. Its count goes on (the others count only a growing one), and
        the next answer (``welcome/<n>``) must be newer than the last."""
        keys = (f"alive/{self.cfg.node_rank}", f"welcome/{self.cfg.node_rank}")
        alive, welcome = self._guarded(lambda: [self._get(k) for k in keys])  # type: ignore[misc]
        if alive is None:
            return False
        self.beats = int(alive["count"])
        self.generation = int(welcome["generation"]) if welcome else 0
        return True

    def run_over(self) -> bool:
        """The store's host's agent has reported its exit: no generation is to come."""
        return self._guarded(lambda: self._get(f"exit/{self.leader}")) is not None

    def exchange(self, record: dict) -> tuple[dict | None, dict | None]:
        """Publish this host's record and keepalive; read every host's. Returns (failure, stop).
        What the store says is applied on the caller's thread: a call that outlived its guard
        (a host cut off) may return long after, and must not set a peer's last keepalive to the
        time it began (a live peer judged silent)."""
        node, scoped = self.cfg.node_rank, self._scoped
        mine, claimed = scoped(f"ranks/{node}"), scoped("failure")
        views = {n: scoped(f"ranks/{n}") for n in self.members}
        exits = [n for n in self.members if n not in self.exits]
        beat = self.beats = self.beats + 1

        def calls() -> tuple:  # on the guard's thread: writes and reads, no state
            self._set(mine, record)
            self._set(f"alive/{node}", {"count": beat})
            alive = {n: (self._get(f"alive/{n}") or {}).get("count", 0) for n in views}
            got = {n: v for n, key in views.items() if (v := self._get(key)) is not None}
            ended = {n: v for n in exits if (v := self._get(f"exit/{n}")) is not None}
            return alive, got, ended, self._get(claimed), self._get("stop")

        alive, got, ended, failure, stop = self._guarded(calls)  # type: ignore[misc]
        now = time.time()
        for n, count in alive.items():
            if count > self.seen.get(n, (0, now))[0]:  # grown: a value sent again is stale
                self.seen[n] = (count, now)
        self.views.update(got)
        self.exits.update(ended)
        return failure, stop

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
        key = self._scoped("failure")
        mine = seal(self.key, key, failure)
        claimed = self._shaped(key, self._guarded(lambda: self._call("compare_set", key, "", mine)))
        if claimed is None:  # what held the key is no failure: this one replaces it
            self._guarded(lambda: self._call("set", key, mine))
            return failure
        return claimed

    def request_stop(self, by: str) -> None:
        stop = seal(self.key, "stop", {"by": by, "time": time.time()})
        self._guarded(lambda: self._call("compare_set", "stop", "", stop))

    def publish_dump(self, record: dict) -> None:
        """This host's forensics record (bundle.py): its ranks' locations, no stacks."""
        self._guarded(lambda: self._set(self._scoped(f"dumped/{self.cfg.node_rank}"), record))

    def dumps(self) -> dict[int, dict]:
        """node -> the forensics record its agent published, for those that did."""
        keys = {n: self._scoped(f"dumped/{n}") for n in self.members}
        got = self._guarded(lambda: {n: self._get(key) for n, key in keys.items()})
        return {n: v for n, v in got.items() if v is not None}  # type: ignore[union-attr]

    def report_exit(self, record: dict) -> None:
        self._guarded(lambda: self._set(f"exit/{self.cfg.node_rank}", record))

    # --- finding the run's store (reconnect), the store's host lost (failover.py) ---
    def stores(self) -> dict[int, int]:
        """The stores the other hosts serve (node rank 0's alone without ``--addresses``) that
        hold a sealed ``leader`` record naming their own host: {node: its generation}.
        StoreGone when every one refuses (no agent of the run serves a store)."""
        others = [n for n in range(len(self.cfg.hosts)) if n != self.cfg.node_rank]
        said = {n: self._probe(n) for n in (others if self.cfg.addresses else [0])}
        if all(record == "refused" for record in said.values()):
            raise StoreGone(f"no host of the run serves its store (port {self.cfg.store_port})")
        return {
            n: r["generation"] for n, r in said.items() if isinstance(r, dict) and r["node"] == n
        }

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
            with contextlib.closing(StoreClient(*address, wait)) as client:
                raw = client.get("leader")
        except (OSError, RuntimeError):
            return None
        return self._shaped("leader", raw)

    def refuses(self, node: int) -> bool:
        """``node``'s address refuses the store's port: its host answers, and no agent of the
        run serves there. A host that does not answer at all may be cut off from this one."""
        return self._probe(node) == "refused"

    def reconnect(self) -> bool:
        """Connect to the run's store again (this host was cut off or left out, or its agent
        started again): the newest generation's of ``stores()``. False while none answers;
        StoreGone when every one refuses (the run is over)."""
        if not (found := self.stores()):
            return False
        self._drop(max(found, key=lambda n: (found[n], -n)))
        try:
            self._guarded(self._open)
        except StoreLost:
            return False
        return True

    def take_over(self, generation: int) -> None:
        """Serve the run's store from this host, from ``generation`` on."""
        self._drop(self.cfg.node_rank)
        self.generation = generation
        self._guarded(self._open)

    def follow(self, node: int, within: float, lost: int) -> None:
        """Connect to the store ``node``'s agent took over, waiting up to ``within`` s (it may
        still be ending its ranks); StoreLost when none comes, CutOff once ``lost``'s agent is
        found serving still: this host was the one cut off (it looks for the run as one left
        out)."""
        self._drop(node)
        deadline = time.monotonic() + within
        while not isinstance(self._probe(node), dict):
            if time.monotonic() > deadline:
                raise StoreLost(f"no store at {self.address(node)} within {within:g}s")
            said = self._probe(lost)
            if isinstance(said, dict) and said["node"] == lost:
                why = f"{self.cfg.hosts[lost]} serves the run's store: this host was cut off"
                raise CutOff(why)
            time.sleep(PROBE_S / 4)
        self._open(within)

    def step_down(self) -> None:
        """Stop serving the store: this host was cut off from every other, which go on under
        another's; it looks for the run's store as any host left out does (``reconnect``)."""
        self._drop(-1)
