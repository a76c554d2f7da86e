"""Losing the host of the run's store (node rank 0's, or the host that took over since): another
host takes over, with no controller.

With ``--addresses`` and a run that may shrink (``--min-hosts`` and ``--restarts``), the run has
no host it cannot lose. When the agents lose the store, each ends its ranks; the lowest-ranked
member left serves a new store on its own address (the same port), the others connect to it,
and they regroup there without the lost host, from the newest checkpoint. Each store holds a
sealed ``leader`` record (its host and generation): a host looking for the run finds the newest
by asking the other hosts' stores, and rejoins at a checkpoint as any host does (regrow.py).

A host cut off from every other cannot tell that from every other host being lost: the one
that would lead alone while others were expected steps down and looks for the run's store as a
host left out does. With too few hosts (``--min-hosts``) or no restart left, the run fails,
naming the lost host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, replace
from typing import TYPE_CHECKING

from ddpfleet_agent.machine import Standing
from ddpfleet_agent.membership import StoreLost
from ddpfleet_agent.ranks import KILL_WAIT
from ddpfleet_agent.records import cause_line

if TYPE_CHECKING:
    from ddpfleet_agent.cli import AgentConfig
    from ddpfleet_agent.failures import Failure
    from ddpfleet_agent.peers import Peers
    from ddpfleet_agent.ranks import LocalRanks
    from ddpfleet_agent.records import Records
    from ddpfleet_agent.restarts import Starts


@dataclass(eq=False)
class FailOver:
    cfg: AgentConfig
    peers: Peers
    ranks: LocalRanks
    _: KW_ONLY
    records: Records
    starts: Starts
    say: Callable[[str], None]

    def moved_on(self) -> bool:
        """This agent starts in a run that went on under another host's store: progress.json
        says this attempt runs, and another host's store names a later generation or host."""
        progress = self.records.progress()
        if progress.get("attempt") != self.cfg.attempt or progress.get("state") != "running":
            return False
        try:
            found = self.peers.stores()
        except StoreLost:
            return False
        return any(node or generation for node, generation in found.items())

    def failed_over(self, standing: Standing) -> tuple[bool, Standing]:
        """Go on under the lowest-ranked member left's store (True); False when this host is left
        out (it looks for the run) or the run cannot go on (the failure says why)."""
        cfg, peers, cause = self.cfg, self.peers, standing.failure or {}
        lost = peers.leader
        left = [n for n in peers.members if n != lost]
        generation, new = peers.generation + 1, left[0]
        self.say(
            f"restart {self.starts.count(cause)} of {cfg.restarts} without {cfg.hosts[lost]} "
            f"from the newest checkpoint, the run's store now on {cfg.hosts[new]}, after: "
            f"{cause_line(cfg.run_id, cause)}"
        )
        try:
            if new == cfg.node_rank:
                peers.take_over(generation)
            else:  # it may still be ending its ranks (forensics, then the kill)
                peers.follow(new, cfg.peer_timeout + cfg.dump_timeout + KILL_WAIT, lost)
        except StoreLost as exc:
            self.say(f"{cfg.hosts[new]} does not serve the run's store ({exc})")
            return False, replace(standing, left_out=True)  # it looks for the run as one left out
        return self.starts.regroup(generation, replace(standing, store_ok=True), cause, [lost])

    def step_down(self, problem: Failure, standing: Standing) -> Standing:
        """This host serves the store and every other fell silent at once: it is the one cut
        off. End the ranks and stop serving, claiming nothing; it looks for the run's store."""
        self.say(f"{problem.get('reason')}: it ends its ranks and stops serving the store")
        self.ranks.end()
        self.peers.step_down()
        return replace(standing, failure=problem, store_ok=False, left_out=True)
