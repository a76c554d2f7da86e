"""Taking a host back into a run that went on without it (``--min-hosts``), at a checkpoint;
and new shares of the global batch for a host that became slow (``--rebalance``), the same way,
or, for one too slow to be worth a share, going on without it until it is fast again.

``Lead`` is node rank 0's watch for both (failover.Heal every member's way back). A host left
out (cut off, judged gone, or its agent started again) keeps trying the run's store and asks to
come back. Node rank 0 waits for the next checkpoint the ranks write (not the one after the
run's last step: the run is ending), then ends the generation with a claimed failure marked
``regrow`` (no forensics: nothing failed): all regroup and restart from that checkpoint with
the host, at the run's first world size again.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

from ddpfleet_agent import failures, stragglers

if TYPE_CHECKING:
    from ddpfleet_agent.cli import AgentConfig
    from ddpfleet_agent.failures import Failure
    from ddpfleet_agent.peers import Peers

ASK_EVERY = 2.0  # seconds between a left-out host's tries of the store


def _host_times(ranks: list[list[dict]]) -> list[float]:
    """Each host's time per image: its slowest rank's (the host's step waits for it), 0 where
    none is known yet."""
    return [max((float(r.get("sec_per_image") or 0) for r in rs), default=0.0) for rs in ranks]


class Lead:
    """Node rank 0's watch while the ranks run: hosts asking to come back (``join_wait``: they
    and the step saved when they asked), and stragglers (``watch``; ``rebalance_wait``: the new
    weights, the speeds, the step saved when it decided, the host to leave out, if any, and the
    median host's seconds per image)."""

    def __init__(self, cfg: AgentConfig, peers: Peers, say: Callable[[str], None]) -> None:
        self.cfg, self.peers, self.say = cfg, peers, say
        self.join_wait: tuple[list[int], float | None] | None = None
        self.join_checked = 0.0
        self.watch = stragglers.Watch()
        self.rebalance_wait: tuple[dict, dict, float | None, int | None, float] | None = None
        self.kept_said: str | None = None  # why new shares changed nothing, said once a start

    def restarted(self) -> None:
        """A new start of the ranks: the detector counts its intervals only."""
        self.watch, self.rebalance_wait, self.kept_said = self.watch.restarted(), None, None

    def _ranks(self) -> list[list[dict]]:
        """Each member's views of its ranks (node rank 0's first)."""
        return [self.peers.views.get(n, {}).get("ranks") or [] for n in self.peers.members]

    def _found(self, node: int, reason: str) -> Failure:
        return failures.failure(self.cfg.hosts, node, None, None, reason, judge=self.cfg.host)

    def regrow(self, now: float) -> Failure | None:
        """End the generation at the first checkpoint after a host left out asked to come back
        (a claimed failure marked ``regrow``), else None."""
        cfg, peers = self.cfg, self.peers
        everyone = len(peers.members) == len(cfg.hosts)
        if not peers.leads or everyone or now - self.join_checked < ASK_EVERY:
            return None
        self.join_checked = now
        asking = peers.joins()
        lead = (self._ranks()[0] or [{}])[0]
        saved, total = lead.get("saved"), lead.get("total_steps")
        if not asking:
            self.join_wait = None
            return None
        names = ", ".join(cfg.hosts[n] for n in asking)
        if self.join_wait is None or self.join_wait[0] != asking:
            self.join_wait = (asking, saved)
            self.say(f"{names} asked to come back: at the run's next checkpoint")
            return None
        if saved is None or saved == self.join_wait[1]:
            return None
        if total and saved >= total:  # the ranks are ending the run
            self.join_wait = (asking, saved)
            self.say(f"{names} not taken back: the run saved its last step ({int(saved)})")
            return None
        # the ranks may save again before they are ended: the restart's entry names the
        # checkpoint it resumed from once it knows it (restarts.Starts.track)
        found = self._found(asking[0], f"{names} back after the checkpoint of step {int(saved)}")
        return {**found, "regrow": asking}

    def rebalance(self, now: float, weights: dict[str, float] | None) -> Failure | None:
        """Once a host's share no longer fits its speed (stragglers.observe), end the generation
        at the next checkpoint with new shares (a claimed failure marked ``rebalance``: each
        host's weight, over ``weights``, the shares now), else None."""
        cfg, members, ranks = self.cfg, self.peers.members, self._ranks()
        if not self.peers.leads or cfg.rebalance != "auto" or not all(ranks):
            return None
        saved, total = ranks[0][0].get("saved"), ranks[0][0].get("total_steps")
        if self.rebalance_wait is None:
            shares = [sum(int(r.get("batch") or 0) for r in rs) for rs in ranks]
            step = min(int(r.get("interval_step") or 0) for rs in ranks for r in rs)
            times = _host_times(ranks)
            self.watch, middle = stragglers.observe(self.watch, step, shares, times, now)
            if middle is not None:
                named = zip((cfg.hosts[n] for n in members), middle, strict=True)
                speed = stragglers.weights(dict(named))
                out = self._too_slow(speed)
                said = ", ".join(f"{h} {s:.2f}x" for h, s in speed.items())
                # the host left out gets a full share again once its compute check passes
                back = {} if out is None else {cfg.hosts[out]: 1.0}
                new = {**(weights or {}), **speed, **back}
                kept = None if out is not None else self._shares_kept(ranks, new)
                if kept is not None:
                    self.watch = self.watch.not_counted()
                    if kept != self.kept_said:
                        self.kept_said = kept
                        self.say(f"hosts' speeds {said}: {kept}; no restart")
                    return None
                what = "new shares" if out is None else f"{cfg.hosts[out]} left out"
                self.say(f"hosts' speeds {said}: {what} at the run's next checkpoint")
                # the median host's seconds per image (a rank's): what the check is held to
                self.rebalance_wait = (new, speed, saved, out, statistics.median(middle))
            return None
        weights, speed, before, out, pace = self.rebalance_wait
        if saved is None or saved == before:
            return None
        self.rebalance_wait = None
        if total and saved >= total:  # the ranks are ending the run
            return None
        slowest = min(members, key=lambda n: speed.get(cfg.hosts[n], 1.0)) if out is None else out
        what = "new shares" if out is None else f"{cfg.hosts[out]} left out"
        found = self._found(slowest, f"{what} after the checkpoint of step {int(saved)}")
        left = {} if out is None else {"leave_out": [out], "pace": float(f"{pace:.6g}")}
        return {**found, "rebalance": weights, "speeds": speed, **left}

    def _shares_kept(self, ranks: list[list[dict]], weights: dict[str, float]) -> str | None:
        """Why new ``weights`` would restart the ranks for nothing: the split the trainer makes
        of the same global batch (stragglers.split, over each member's ranks in rank order)
        gives every rank the share it has, or gives one a share of 0, which the trainer refuses;
        None when the shares would change."""
        hosts = self.cfg.hosts
        ordered = [sorted(rs, key=lambda r: int(r.get("rank") or 0)) for rs in ranks]
        owners = [hosts[n] for n, rs in zip(self.peers.members, ordered, strict=True) for _ in rs]
        now = [int(r.get("batch") or 0) for rs in ordered for r in rs]
        split = stragglers.split(sum(now), [weights.get(h, 1.0) for h in owners])
        if split == now:
            return "the shares they give are the ones the ranks have"
        if 0 in split:
            return f"a rank of {owners[split.index(0)]} would get 0 of the {sum(now)} images"
        return None

    def _too_slow(self, speed: dict[str, float]) -> int | None:
        """The host to leave out rather than give a share (stragglers.too_slow): one the run
        takes back (``--min-hosts``, ``--restarts``) and may go on without, not the store's."""
        cfg, members = self.cfg, self.peers.members
        if not cfg.takes_hosts_back or failures.too_few(len(members) - 1, cfg.min_hosts):
            return None
        may = [cfg.hosts[n] for n in members if n != self.peers.leader]
        host = stragglers.too_slow(speed, may)
        return None if host is None else cfg.hosts.index(host)

    def speed(self) -> float | None:
        """This host's speed relative to the median member's (the metrics), None unknown."""
        times, members = _host_times(self._ranks()), self.peers.members
        if self.cfg.node_rank not in members or not all(times):
            return None
        return round(stragglers.speeds(times)[members.index(self.cfg.node_rank)], 3)
