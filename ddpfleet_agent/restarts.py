"""Restarting a failed run in place (``--restarts N``), with no controller.

The ``Restarting`` half of ``supervise.Agent``. When the run fails and ``failures.
restart_refusal`` allows it (a rank's failure on a host still there, restarts left, not the
same rank at the same step as before the last restart), every agent decides the same from the
failure claimed in the store: it kills its ranks, says it is ready in the store's next
generation (``Peers.regroup``), and once every host is, starts its command again with
``DDPFLEET_RESTART=<n>`` (``RESTART_ENV``; ddpfleet's trainer then resumes from the newest
checkpoint, whatever ``--resume`` said). Each start is an entry of the run's ``attempts`` list
(progress.json, and summary.json at the end): hosts, world size, start time, the steps it ran,
the cause of the restart and the heal time (the failure to the first step of the new start).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from ddpfleet_agent import failures
from ddpfleet_agent.peers import StoreLost
from ddpfleet_agent.ranks import KILL_WAIT
from ddpfleet_agent.records import cause_line

RESTART_ENV = "DDPFLEET_RESTART"  # the restart count, in the restarted command's environment

if TYPE_CHECKING:
    from ddpfleet_agent.cli import AgentConfig
    from ddpfleet_agent.failures import Failure
    from ddpfleet_agent.peers import Peers
    from ddpfleet_agent.ranks import LocalRanks


class Restarting:
    cfg: AgentConfig
    peers: Peers
    ranks: LocalRanks
    failure: Failure | None
    diagnosis: str | None
    first_train: tuple[float, int] | None
    store_ok: bool
    signum: int
    child_env: dict[str, str]
    # and, from supervise.Agent: say(), _failure(), _claim()

    causes: list[Failure]  # the failures the run was restarted after, in order
    attempts: list[dict]

    @property
    def restarts(self) -> int:
        """Restarts in place so far."""
        return len(self.causes)

    @property
    def label(self) -> str:
        """This start's name: the attempt, with -r<n> after the n-th restart (forensics)."""
        return f"{self.cfg.attempt}-r{self.restarts}" if self.restarts else self.cfg.attempt

    def _start_ranks(self, cause: Failure | None = None) -> None:
        """Start the command (again) and open its entry in the attempts list."""
        if self.restarts:
            self.child_env[RESTART_ENV] = str(self.restarts)
        self.ranks.start(self.child_env)
        cfg = self.cfg
        self.attempts.append({
            "attempt": cfg.attempt, "restart": self.restarts, "started": self.ranks.started,
            "hosts": list(cfg.hosts), "world_size": cfg.world_size or None, "from_step": None,
            "to_step": None, "cause": cause_line(cfg.run_id, cause) if cause else None,
            "failed_at": cause.get("time") if cause else None, "heal_sec": None,
        })  # fmt: skip

    def _track(self, now: float) -> None:
        """The current start's steps (node rank 0's first rank), and its heal time: from the
        failure to the first step past the one it resumed from."""
        lead = (self.peers.views.get(0, {}).get("ranks") or [None])[0]
        step = int((lead or {}).get("step") or 0)
        if not lead or (lead.get("phase") == "start" and not step):
            return  # not started, or not yet past its first record (before it knows its step)
        entry = self.attempts[-1]
        if entry["from_step"] is None:
            entry["from_step"] = step
        entry["to_step"] = step
        if entry["failed_at"] and entry["heal_sec"] is None and step > entry["from_step"]:
            entry["heal_sec"] = round(now - entry["failed_at"], 1)

    def _restarted(self, outcome: str) -> bool:
        """After the run failed: restart it in place (True) or let it end (False; a refusal
        worth saying goes into the failure's reason)."""
        cause = self.failure
        if outcome != "failed" or cause is None or self.signum or not self.store_ok:
            return False
        why = failures.restart_refusal(cause, self.causes, self.cfg.restarts)
        if why is not None:
            if why:
                self.failure = {**cause, "reason": f"{cause.get('reason')}; {why}"}
            return False
        self.ranks.kill_all()
        self.ranks.wait_output()
        self.causes.append(cause)
        self.say(
            f"restart {self.restarts} of {self.cfg.restarts} from the newest checkpoint after: "
            + cause_line(self.cfg.run_id, cause)
        )
        try:
            # the others may still be taking their forensics bundle and killing their ranks
            within = self.cfg.peer_timeout + self.cfg.dump_timeout + KILL_WAIT
            missing = self.peers.regroup(self.restarts, within)
        except StoreLost as exc:
            self.store_ok = False
            why = f"lost the run's store at a restart ({exc})"
            self.failure = self._failure(0, None, None, why)
            return False
        if missing:
            gone = self._failure(missing[0], None, None, "its agent did not come back to restart")
            self.failure = self._claim(gone)
            return False
        self.failure, self.diagnosis, self.first_train = None, None, None
        for old in self.ranks.heartbeat_dir.glob("rank-*.json"):  # the last start's beats
            with contextlib.suppress(OSError):
                old.unlink()
        self.attempts[-1]["ended"] = time.time()
        self._start_ranks(cause)
        return True
