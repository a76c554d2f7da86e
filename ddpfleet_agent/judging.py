"""What an agent judges from what it sees: failures.py's rules applied to its ranks, its
peers' views and keepalives, and the exit of its command. A failure names the host, rank and
the step it had reached; claimed in the run's store, the first claim wins, so every host names
the same cause.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from ddpfleet_agent import failures
from ddpfleet_agent.failures import Failure
from ddpfleet_agent.machine import Standing
from ddpfleet_agent.peers import StoreLost
from ddpfleet_agent.ranks import rank_views

if TYPE_CHECKING:
    from ddpfleet_agent.cli import AgentConfig
    from ddpfleet_agent.peers import Peers
    from ddpfleet_agent.ranks import LocalRanks

EXIT_STOPPED = 143  # the agent's exit code after a stop (SIGTERM's)


def claim(peers: Peers, standing: Standing, failure: Failure) -> Standing:
    """``failure`` claimed in the run's store: the first claim's wins; unclaimed, the store
    lost, where it does not answer."""
    try:
        return replace(standing, failure=peers.claim(failure))
    except StoreLost:
        return replace(standing, failure=failure, store_ok=False)


class Judge:
    def __init__(self, cfg: AgentConfig, peers: Peers, ranks: LocalRanks) -> None:
        self.cfg, self.peers, self.ranks = cfg, peers, ranks

    def failure(
        self, node: int, reason: str, rank: int | None = None, code: int | None = None, **kw: bool
    ) -> Failure:
        """The failure of ``node`` (its ``rank``, where one is to blame, and exit ``code``) and
        the step it reached; ``kw``: restartable, gone (failures.Failure)."""
        views = self.peers.views.get(node, {}).get("ranks") or []
        if rank is None:  # a whole host: name its first rank (the only one with one per host)
            members = self.peers.members  # torchrun's node ranks: the members' order
            first = members.index(node) * self.cfg.nproc if node in members else None
            rank = min((r["rank"] for r in views), default=first)  # before any view of it too
        local = rank_views(self.ranks.heartbeats(), 0) if node == self.cfg.node_rank else []
        step = {r["rank"]: r["step"] for r in [*views, *local]}.get(rank)  # its last word
        hosts, judge = self.cfg.hosts, self.cfg.host
        return failures.failure(hosts, node, rank, code, reason, judge=judge, step=step, **kw)

    def store_lost(self, exc: Exception) -> Failure:
        """The failure of losing the store: its host, gone when another may take over."""
        node = self.peers.leader
        reason = f"lost the connection to the run's store on {self.cfg.hosts[node]} ({exc})"
        found = self.failure(node, reason, gone=self.cfg.can_fail_over)
        return {**found, "store_lost": True}

    def ended(self, code: int, standing: Standing, stopping: bool) -> tuple[str, int, Standing]:
        """The command exited by itself: completed, stopped, or a failure to name."""
        if code == 0:
            return "completed", 0, standing
        if stopping:
            return "stopped", EXIT_STOPPED, standing
        self.ranks.wait_output()
        rank, rcode, reason = self.ranks.failed_rank(code)
        mine = self.failure(self.cfg.node_rank, reason, rank=rank, code=rcode, restartable=True)
        # A dead rank or host makes the others fail too: publish this exit, watch the peers'
        # for a moment, and name a host that went silent, else the first cause of all exits.
        # A host silent at the end of the watch gets one more to speak: a busy host's agent
        # lags a second or two, and one may not have been heard yet when a rank fails at once.
        silent: list[int] = []
        for _ in range(2):
            failure, standing = self._watch(mine, standing)
            if failure is not None:
                return "failed", code, replace(standing, failure=failure)
            store_ok = standing.store_ok
            silent = self.peers.silent(time.time(), self.cfg.settle * 0.75) if store_ok else []
            if not silent:
                break
        if silent:
            why = "host stopped responding (its agent's keepalive ended: container or host gone)"
            mine = self.failure(silent[0], why, gone=True)
        elif store_ok:
            cause = failures.first_cause([mine, *self.peers.exit_causes()])
            mine = {**cause, "claimed_by": self.cfg.host}
        return "failed", code, claim(self.peers, standing, mine)

    def _watch(self, mine: Failure, standing: Standing) -> tuple[Failure | None, Standing]:
        """Publish this host's exit (its cause ``mine``) and read the peers' for ``settle`` s:
        the failure claimed in that time, if any (the store lost: none, ``store_ok`` False)."""
        deadline = time.time() + self.cfg.settle
        while time.time() < deadline:
            try:
                failure, _ = self.peers.exchange({**self.ranks.record("exited"), "cause": mine})
            except StoreLost:
                return None, replace(standing, store_ok=False)
            if failure is not None:
                return failure, standing
            time.sleep(self.cfg.tick / 2)
        return None, standing

    def check(self, now: float, started: float) -> Failure | None:
        """A failure this agent sees while its command runs (``started`` then), or None. The
        store's host that lost every other host at once is cut off, whatever its own ranks do:
        where enough hosts are left the others go on without it (failover.py)."""
        cfg, beat, members = self.cfg, self.cfg.heartbeat_timeout, len(self.peers.members)
        silent = self.peers.silent(now, cfg.peer_timeout)
        gone = failures.host_problem(silent, members, cfg.node_rank, cfg.peer_timeout)
        # this host serves the store, and another may take over with enough hosts left
        short = failures.too_few(members - 1, cfg.min_hosts)
        steps_down = self.peers.leads and cfg.can_fail_over and not short
        if gone and gone[0] == cfg.node_rank and steps_down:
            return {**self.failure(gone[0], gone[1]), "cut_off": True}
        # paused past the peer timeout (a frozen VM): the others lost its store and went on,
        # whatever keepalives of theirs, queued meanwhile, it reads now (awake.py)
        paused = self.ranks.awake.longest(now - cfg.peer_timeout, now)
        if steps_down and paused > cfg.peer_timeout:
            why = f"this host was paused for {paused:.0f}s, past the peer timeout (cut off)"
            return {**self.failure(cfg.node_rank, why), "cut_off": True}
        beats = self.ranks.views(now)
        frozen = failures.rank_problem(beats, beat, cfg.stop_timeout)
        if frozen is not None:
            return self.failure(cfg.node_rank, frozen[1], rank=frozen[0], restartable=True)
        if hang := failures.hang_cause(self.peers.views, cfg.hosts, beat, judge=cfg.host):
            return hang
        if gone is not None:
            return self.failure(gone[0], gone[1], gone=gone[0] != cfg.node_rank)
        late = failures.runtime_problem(started, now, cfg.max_runtime)
        return None if late is None else self.failure(cfg.node_rank, late)
