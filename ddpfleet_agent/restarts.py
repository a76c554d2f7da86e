"""Restarting a failed run in place (``--restarts N``), with no controller, and this host's
starts of the command (``Starts``).

When ``failures.restart_refusal`` allows it, every agent decides the same from the failure
claimed in the store: it kills its ranks, says it is ready in the store's next generation
(``Peers.regroup``), and once every host is, starts its command again with
``DDPFLEET_RESTART=<n>`` (ddpfleet's trainer then resumes from the newest checkpoint, whatever
``--resume`` said). Each start is an entry of the run's ``attempts`` list (progress.json,
summary.json): hosts, world size, start time, steps, the restart's cause and heal time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ddpfleet_agent import failures, stragglers
from ddpfleet_agent.judging import claim
from ddpfleet_agent.machine import Standing
from ddpfleet_agent.peers import StoreLost
from ddpfleet_agent.ranks import KILL_WAIT
from ddpfleet_agent.records import cause_line

if TYPE_CHECKING:
    from ddpfleet_agent.cli import AgentConfig
    from ddpfleet_agent.failures import Failure
    from ddpfleet_agent.judging import Judge
    from ddpfleet_agent.peers import Peers
    from ddpfleet_agent.ranks import LocalRanks

RESTART_ENV = "DDPFLEET_RESTART"  # the generation (starts before this one), in a restart's env
NEWEST = "the newest checkpoint"  # a regrow's restart: which one, once its ranks say (track)
# In a run that goes on without a host (``--min-hosts``): the first attempt's world size and
# which of its global ranks remain, in the new ranks' order. ddpfleet's trainer splits the
# same global batch among them (trainer.balance.attempt_batches).
FULL_WORLD_ENV, KEPT_RANKS_ENV = "DDPFLEET_FULL_WORLD", "DDPFLEET_KEPT_RANKS"
WEIGHTS_ENV = "DDPFLEET_BATCH_WEIGHTS"  # after a rebalance: a weight per rank of the first world


def regrouped(
    command: list[str], nnodes: int, node_rank: int, master: str | None = None
) -> list[str]:
    """The command with torchrun's own ``--nnodes=``, ``--node-rank=`` and, where given,
    ``--master-addr=`` (the first member's host: it serves the rendezvous) for a new membership
    (its options up to the program, as launch.yml writes them)."""
    out = list(command)
    at = next((i for i, part in enumerate(out) if Path(part).name == "torchrun"), len(out))
    new = {"--nnodes": nnodes, "--node-rank": node_rank, "--master-addr": master or None}
    for i in range(at + 1, len(out)):
        if not out[i].startswith("--"):
            break
        option = out[i].split("=", 1)[0]
        if "=" in out[i] and new.get(option) is not None:
            out[i] = f"{option}={new[option]}"
    return out


@dataclass(eq=False)
class Starts:
    """This host's starts of the command: the run's ``attempts`` (an entry per start), the
    failures it was restarted after (``causes``) and each host's weight of the global batch
    after a rebalance (``weights``, None: even shares)."""

    cfg: AgentConfig
    peers: Peers
    ranks: LocalRanks
    _: KW_ONLY
    judge: Judge
    env: dict[str, str]
    say: Callable[[str], None]
    causes: list[Failure] = field(default_factory=list)
    attempts: list[dict] = field(default_factory=list)
    weights: dict[str, float] | None = None

    @property
    def restarts(self) -> int:
        return len(self.causes)

    @property
    def within(self) -> float:
        """How long the others may take to regroup: still taking forensics, killing ranks."""
        return self.cfg.peer_timeout + self.cfg.dump_timeout + KILL_WAIT

    @property
    def label(self) -> str:
        """This start's name: the attempt, with -r<n> after the n-th restart (forensics)."""
        return f"{self.cfg.attempt}-r{self.restarts}" if self.restarts else self.cfg.attempt

    @property
    def hosts(self) -> list[str]:
        """The hosts of this start, in its node-rank order."""
        return [self.cfg.hosts[n] for n in self.peers.members]

    def began(self) -> float | None:
        """When the run's first start began (None: not yet)."""
        return self.attempts[0]["started"] if self.attempts else None

    def record(self) -> dict:
        """The run's restarts and starts so far, for the welcome of a host let back in."""
        return {"causes": list(self.causes), "attempts": [dict(a) for a in self.attempts]}

    def take_record(self, said: dict) -> None:
        """The run's restarts and starts as the store's host has them (``record``, in its
        welcome), for a host let back in: its own missed those it was out of, or counted a
        failover it tried while it was the one cut off. Every host then refuses a restart past
        the same count, and writes the whole run's attempts should it come to serve the store."""
        if said.get("causes") is not None:
            self.causes = list(said["causes"])
        if said.get("attempts"):
            self.attempts = [dict(a) for a in said["attempts"]]

    def count(self, cause: Failure, how: str) -> None:
        """Count a restart after ``cause`` and say ``how`` the run goes on."""
        self.causes.append(cause)
        line = cause_line(self.cfg.run_id, cause)
        self.say(f"restart {self.restarts} of {self.cfg.restarts} {how} after: {line}")

    def start(self, cause: Failure | None = None) -> None:
        """Start the command on the members (renumbered) and open its attempts entry."""
        cfg, env, members = self.cfg, self.env, self.peers.members
        if self.peers.generation:  # the trainer then resumes from the newest checkpoint
            env[RESTART_ENV] = str(self.peers.generation)
        master = self.peers.address(members[0]) if cfg.addresses else None
        command = regrouped(cfg.command, len(members), members.index(cfg.node_rank), master)
        if len(members) < len(cfg.hosts):
            kept = [n * cfg.nproc + local for n in members for local in range(cfg.nproc)]
            env[FULL_WORLD_ENV], env[KEPT_RANKS_ENV] = str(cfg.world_size), ",".join(map(str, kept))
        else:  # every host (again): the first attempt's world
            env.pop(FULL_WORLD_ENV, None)
            env.pop(KEPT_RANKS_ENV, None)
        if self.weights:  # new shares (regrow.py): a weight per global rank of the first world
            weights = [self.weights.get(h, 1.0) for h in cfg.hosts for _ in range(cfg.nproc)]
            env[WEIGHTS_ENV] = ",".join(f"{w:g}" for w in weights)
        self.ranks.start(command, env)
        why = None if cause is None else cause_line(cfg.run_id, cause)
        cause = cause or {}
        if cause.get("regrow"):  # the step: once the ranks say it (track)
            why = f"{', '.join(cfg.hosts[n] for n in cause['regrow'])} back: rejoined at {NEWEST}"
        world = cfg.nproc * len(members) if cfg.world_size else None
        self.attempts.append(
            {
                "attempt": cfg.attempt,
                "restart": self.restarts,
                "started": self.ranks.started,
                "hosts": self.hosts,
                "world_size": world,
                **dict.fromkeys(("global_batch", "shares", "from_step", "to_step")),
                "cause": why,
                "failed_at": cause.get("time"),
                "heal_sec": None,
            }
        )
        if cause.get("rebalance"):  # its line once the new shares are known (_shares)
            self.attempts[-1].update(cause="rebalanced", speeds=cause.get("speeds"))

    def track(self, now: float) -> None:
        """The current start's steps (node rank 0's first rank), and its heal time: from the
        failure to the first step past the one it resumed from."""
        lead = (self.peers.views.get(self.peers.members[0], {}).get("ranks") or [None])[0]
        step = int((lead or {}).get("step") or 0)
        if not lead or (lead.get("phase") == "start" and not step):
            return  # not started, or not yet past its first record (before it knows its step)
        entry = self.attempts[-1]
        if entry["from_step"] is None:
            entry["from_step"] = step
            if (entry["cause"] or "").endswith(f" back: rejoined at {NEWEST}"):
                entry["cause"] = entry["cause"].replace(NEWEST, f"the checkpoint of step {step}")
        if entry["shares"] is None:
            self._shares(entry)
        entry["to_step"] = step
        if entry["failed_at"] and entry["heal_sec"] is None and step > entry["from_step"]:
            entry["heal_sec"] = round(now - entry["failed_at"], 1)

    def _shares(self, entry: dict) -> None:
        """The start's global batch and every rank's share of it (in micro-batches where
        more than one), as its ranks' heartbeats say once every rank has said it."""
        views = self.peers.views
        found = (r for n in self.peers.members for r in views.get(n, {}).get("ranks") or [])
        ranks = sorted(found, key=lambda r: r["rank"])
        shares = [r.get("batch") for r in ranks]
        if not shares or None in shares or len(shares) != (entry["world_size"] or len(shares)):
            return
        micro = [int(r.get("micro_batches") or 1) for r in ranks]
        entry["shares"], entry["global_batch"] = [int(b) for b in shares], int(sum(shares))
        if max(micro) > 1:
            entry["micro_batches"] = micro
        if entry["cause"] == "rebalanced" and len(self.attempts) > 1:
            before, after = (self._host_shares(e) for e in self.attempts[-2:])
            entry["cause"] = stragglers.change_line(before, after, entry.get("speeds") or {})

    def _host_shares(self, entry: dict) -> dict[str, int]:
        """Each host's images of a step in a start (its ranks' shares summed)."""
        shares, nproc = entry.get("shares") or [], self.cfg.nproc
        return {h: sum(shares[i * nproc : (i + 1) * nproc]) for i, h in enumerate(entry["hosts"])}

    def restarted(self, standing: Standing) -> tuple[bool, Standing]:
        """Restart the failed run (its ranks ended) in place or without a host that is gone;
        True when this host's ranks run again."""
        cause = standing.failure or {}
        how = f"without {cause.get('host')}" if cause.get("gone") else "in place"
        self.count(cause, f"{how} from the newest checkpoint")
        left_out = [int(cause.get("node_rank", -1))] if cause.get("gone") else []
        # the run's next generation, not this host's count of starts: a host let back in
        # (failover.Heal.rejoined) missed the starts it was out of
        return self.regroup(self.peers.generation + 1, standing, cause, left_out)

    def regroup(
        self,
        generation: int,
        standing: Standing,
        cause: Failure | None,
        left_out: list[int],
        *,
        joining: list[int] | None = None,
        weights: dict[str, float] | None = None,
    ) -> tuple[bool, Standing]:
        """Regroup the hosts for ``generation`` (membership.py) and start this host's ranks in
        it (True), with new ``weights`` if any; False when this host is not in it or the run
        cannot go on (the failure says why). The store's host that no other host came to, in a
        run where another may take over, is the one cut off: it steps down, claiming nothing."""
        cfg = self.cfg
        try:
            said = self.peers.regroup(generation, self.within, left_out, joining)
        except StoreLost as exc:
            why = f"lost the run's store at a restart ({exc})"
            return False, replace(standing, store_ok=False, failure=self.judge.failure(0, why))
        if cfg.node_rank not in said["nodes"]:
            self.say("left out of the restarted run: its other hosts went on without this one")
            return False, replace(standing, left_out=True)
        missing = said["missing"]
        if missing and cfg.can_fail_over and said["nodes"] == [cfg.node_rank]:
            self.say(
                "no other host came to restart: it is the one cut off and stops serving the store"
            )
            self.peers.step_down()
            return False, replace(standing, store_ok=False, left_out=True)
        if missing and (not cfg.min_hosts or failures.too_few(len(said["nodes"]), cfg.min_hosts)):
            why = "its agent did not come back to restart"
            return False, claim(self.peers, standing, self.judge.failure(missing[0], why))
        for old in self.ranks.heartbeat_dir.glob("rank-*.json"):  # the last start's beats
            with contextlib.suppress(OSError):
                old.unlink()
        if self.attempts:
            self.attempts[-1]["ended"] = time.time()
        self.weights = weights or self.weights
        self.start(cause)
        return True, replace(standing, failure=None, diagnosis=None)
