"""The ways back of a run, with no controller, but a restart in place (restarts.py): failing
over when the host of the run's store is lost, restarting with hosts taken back or new shares
(regrow.py), and asking to come back once left out (cut off, judged gone, or started again).

With ``--addresses`` and a run that may shrink (``--min-hosts`` and ``--restarts``), the run has
no host it cannot lose. When the agents lose the store (node rank 0's, or the host's that took
over since), each ends its ranks; the lowest-ranked member left serves a new store on its own
address (the same port), the others connect to it, and they regroup there without the lost
host, from the newest checkpoint. Each store holds a sealed ``leader`` record (its host and
generation): a host looking for the run finds the newest by asking the other hosts' stores.
A host cut off from every other cannot tell that from every other host being lost: the one
that would lead alone while others were expected steps down and looks for the run's store as a
host left out does, until let back, the run over, its max_runtime or a stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ddpfleet_agent import failures
from ddpfleet_agent.gate import Gate, check_command
from ddpfleet_agent.machine import Standing
from ddpfleet_agent.membership import CutOff, StoreGone, StoreLost
from ddpfleet_agent.regrow import ASK_EVERY
from ddpfleet_agent.stragglers import PAR_AGAIN

if TYPE_CHECKING:
    from ddpfleet_agent.cli import AgentConfig
    from ddpfleet_agent.failures import Failure
    from ddpfleet_agent.peers import Peers
    from ddpfleet_agent.ranks import LocalRanks
    from ddpfleet_agent.records import Records
    from ddpfleet_agent.restarts import Starts


@dataclass(eq=False)
class Heal:
    """Each way back of a run's generation but a restart in place: (True, standing) when this
    host's ranks run again. ``stopped``: a stop came (SIGTERM, SIGINT)."""

    cfg: AgentConfig
    peers: Peers
    ranks: LocalRanks
    records: Records
    starts: Starts
    say: Callable[[str], None]
    stopped: Callable[[], bool]
    # when a compute check last passed this host, left out as too slow, on the others' pace
    # alone: a loader or a disk slows its ranks but not the check, so for stragglers.PAR_AGAIN
    # s from then it is held to its own first figure (0: never)
    on_par_at: float = 0.0

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
        out (it looks for the run) or the run cannot go on (the failure says why). A member
        that serves no store within ``Starts.within`` while its host refuses the store's port
        (up, its agent gone: two hosts' agents lost at once) is passed over: the next one in
        node rank order serves the store, and the hosts regroup without both; unless the run
        ended (progress.json: stopped, say, while this host was cut off; it finds the run over)
        or its shared storage still does not answer (it looks for the run), or too few hosts
        would be left (the run fails, saying so). One that does not answer at all may be cut
        off from this host alone (a partition): this host then looks for the run as one left
        out, as the hosts beyond a cut do."""
        cfg, peers, cause = self.cfg, self.peers, standing.failure or {}
        lost = peers.leader
        left = [n for n in peers.members if n != lost]
        generation = peers.generation + 1
        store = f"the run's store now on {cfg.hosts[left[0]]},"
        self.starts.count(cause, f"without {cfg.hosts[lost]} from the newest checkpoint, {store}")
        passed: list[int] = []  # successors whose agent is gone, as the store's host's
        for at, new in enumerate(left):
            try:
                if new == cfg.node_rank:
                    peers.take_over(generation)
                else:  # it may still be ending its ranks (forensics, then the kill)
                    peers.follow(new, self.starts.within, lost)
                break
            except StoreLost as exc:
                why = f"{cfg.hosts[new]} does not serve the run's store ({exc})"
                last = isinstance(exc, CutOff) or new == cfg.node_rank or at + 1 == len(left)
                if last or not peers.refuses(new):
                    self.say(why)
                    return False, replace(standing, left_out=True)  # it looks for the run
                # stopped, say, while this host was cut off (it finds the run over), or its
                # storage still silent (it looks for the run)
                if not_live := self._not_live():
                    self.say(f"{why}: {not_live}")
                    return False, replace(standing, left_out=True)
                refused = f"{why} and its host refuses the store's port"
                if short := failures.too_few(len(left) - len(passed) - 1, cfg.min_hosts):
                    self.say(f"{refused}: {short}")
                    reason = f"{cause.get('reason')}; not restarted: {short}"
                    return False, replace(standing, failure={**cause, "reason": reason})
                passed.append(new)
                self.say(f"{refused}: the run's store now on {cfg.hosts[left[at + 1]]}")
        regroup = self.starts.regroup
        return regroup(generation, replace(standing, store_ok=True), cause, [lost, *passed])

    def _not_live(self) -> str:
        """Why this host must not go on past a successor whose agent is gone: progress.json says
        the run ended, or cannot be read ('' when it says the run goes on). Read afresh: a host
        that refuses the store's port answered, so this host is on the network again and its
        shared storage may answer; if it still does not, the run's state is unknown and its
        checkpoints are out of reach, so this host starts nothing alone either."""
        self.records.storage_back()
        state = self.records.progress().get("state")
        if self.records.storage_silent:
            return "its shared storage does not answer: it cannot tell whether the run goes on"
        return "the run has ended without this host" if state == "ended" else ""

    def step_down(self, problem: Failure, standing: Standing) -> Standing:
        """This host serves the store and every other fell silent at once: it is the one cut
        off. End the ranks and stop serving, claiming nothing; it looks for the run's store."""
        self.say(f"{problem.get('reason')}: it ends its ranks and stops serving the store")
        self.ranks.end()
        self.peers.step_down()
        return replace(standing, failure=problem, store_ok=False, left_out=True)

    def regrown(self, standing: Standing) -> tuple[bool, Standing]:
        """Once node rank 0 ended the generation to take hosts back or to give new shares (the
        ranks ended): restart from the newest checkpoint with them."""
        cause = standing.failure or {}
        joining = [int(n) for n in cause.get("regrow") or []]
        leaving = [int(n) for n in cause.get("leave_out") or []]
        new = cause.get("rebalance") or {}
        weights = {str(h): float(w) for h, w in new.items()} if new else self.starts.weights
        after = self.peers.generation + 1  # the restart's (Starts.restarted)
        back = " with every host back" if joining else ""
        back += f" without {', '.join(self.cfg.hosts[n] for n in leaving)}" if leaving else ""
        self.say(f"{cause.get('reason')}: restart from the newest checkpoint{back}")
        if self.peers.leads:
            try:
                self.peers.welcome(after, joining, weights, self.starts.record())
            except StoreLost:
                return False, replace(standing, store_ok=False)
        regroup = self.starts.regroup
        return regroup(after, standing, cause, leaving, joining=joining, weights=weights)

    def rejoined(self, standing: Standing, again: bool = False) -> tuple[bool, Standing]:
        """A host cut off or left out, or whose agent was started ``again`` in the run: try the
        store every ASK_EVERY s and ask to come back until node rank 0 lets it in, then regroup
        with the members it named (and the run's new shares); not when the run ended first, at
        the run's max_runtime or on a stop."""
        why = "started again in the run:" if again else "out of the run: its ranks are ended;"
        cause = standing.failure or {}
        slow = self.cfg.node_rank in (cause.get("leave_out") or [])
        pace = cause.get("pace")  # a rank's seconds per image
        par = self.cfg.nproc / pace if pace else None  # the median host's images/s
        par_from = self.on_par_at and self.on_par_at + PAR_AGAIN
        gate = Gate(check_command(self.cfg.command), self.say, par, par_from) if slow else None
        when = " once doctor's compute check says it is fast again," if slow else ""
        self.say(f"{why} it asks to come back{when} until the run ends")
        limit = self.cfg.max_runtime and (self.starts.began() or time.time()) + self.cfg.max_runtime
        connected = asked = False
        try:
            while not self.stopped() and not (limit and time.time() > limit):
                try:
                    if not connected and self.peers.reconnect():
                        connected = True
                        if again:  # it goes on from its earlier agent's keepalive and answer
                            self.peers.ran_before()
                    if connected and self.peers.run_over():
                        break
                    said = self.peers.welcomed() if connected else None
                    if said is not None:
                        return self._back(said, standing)
                    if connected and (gate is None or gate.passed(time.time())):
                        self.peers.ask_to_join()
                        asked = True
                except StoreGone:
                    break
                except StoreLost:
                    connected = False
                if self.records.progress().get("state") == "ended":
                    break
                time.sleep(ASK_EVERY)
        finally:  # a check still running is ended
            if gate is not None:
                if gate.on_par:
                    self.on_par_at = time.time()
                gate.close()
        # one that asked and was not let back before the end was left out, however it got here
        # (its store lost to it while it was frozen, or told it left out)
        return False, replace(standing, left_out=standing.left_out or asked)

    def _back(self, said: dict, standing: Standing) -> tuple[bool, Standing]:
        self.say(f"back in the run at its generation {said['generation']}")
        self.starts.take_record(said)
        self.records.storage_back()  # the members are those said (Peers.welcomed)
        back = replace(standing, store_ok=True, left_out=False)
        # its start is the run's regrow, as the store's host records it: should this host come
        # to serve the store, it writes the same entry
        cause: Failure = {"regrow": said.get("joining") or [self.cfg.node_rank]}
        regroup = self.starts.regroup
        return regroup(said["generation"], back, cause, [], weights=said.get("weights"))
