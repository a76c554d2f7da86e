"""How an agent reports its run: node rank 0 rewrites progress.json while it runs; at the end
every host reports its exit (store and ``nodes/<host>.exit.json``), and node rank 0 waits for
the others', then writes summary.json, the report of a completed run and the final
progress.json that train.yml's follower waits for. A host cut off from node rank 0 writes the
cause itself if nobody else did.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, replace
from typing import TYPE_CHECKING

from ddpfleet_agent.judging import EXIT_STOPPED
from ddpfleet_agent.machine import Standing
from ddpfleet_agent.peers import StoreLost
from ddpfleet_agent.records import cause_line
from ddpfleet_agent.report import run_status

if TYPE_CHECKING:
    from ddpfleet_agent.cli import AgentConfig
    from ddpfleet_agent.failures import Failure
    from ddpfleet_agent.peers import Peers
    from ddpfleet_agent.ranks import LocalRanks
    from ddpfleet_agent.records import Records
    from ddpfleet_agent.restarts import Starts

PROGRESS_EVERY = 2.0  # seconds between node rank 0's progress.json writes


@dataclass(eq=False)
class Ending:
    cfg: AgentConfig
    peers: Peers
    ranks: LocalRanks
    _: KW_ONLY
    records: Records
    starts: Starts
    say: Callable[[str], None]
    last_progress: float = 0.0
    first_train: tuple[float, int, int] | None = None  # time, step, start

    def finish(self, outcome: str, code: int, standing: Standing, escalated: bool) -> int:
        """Report the exit (``escalated``: the ranks were killed after a stop); the exit code."""
        cfg, failure, records, leads = self.cfg, standing.failure, self.records, self.peers.leads
        self.ranks.end()
        failed = outcome == "failed" and failure
        self.say(cause_line(cfg.run_id, failure) if failed else f"{outcome} (exit code {code})")
        exit_rec = {"host": cfg.host, "node_rank": cfg.node_rank, "attempt": cfg.attempt}
        exit_rec.update(exit_code=code, outcome=outcome, time=time.time())
        if failure:
            exit_rec["failure"] = failure
        if standing.store_ok:
            try:
                self.peers.report_exit(exit_rec)
            except StoreLost:
                standing = replace(standing, store_ok=False)
        records.write_exit(exit_rec)
        self._write_summary(outcome, standing, escalated)
        if leads:
            if standing.store_ok:
                self._wait_for_peers(outcome, failure)
            if cfg.program:
                self._write_program_summary(outcome, exit_rec)
            self.starts.attempts[-1]["ended"] = exit_rec["time"]
            records.write_attempts(self.starts.attempts, self.starts.restarts)
            self._write_end(outcome, failure)
        # the last writes of a completed run (report.png) may take a while, a silent storage one
        bound = cfg.storage_timeout if records.storage_silent else 3 * cfg.storage_timeout
        if not records.flush(bound) or records.storage_silent:
            # the host-local fallback's exit record names the storage as the cause (status.yml)
            within, where = cfg.storage_timeout, cfg.run_dir
            storage = f"the shared storage did not answer within {within:g} s ({where})"
            print(f"ddpfleet agent: {cfg.host}: {storage}", flush=True)
            what = cause_line(cfg.run_id, failure) if failure else f"run {cfg.run_id} {outcome}"
            records.write_local_exit(
                {**exit_rec, "storage": storage, "cause": f"{storage}; {what}"}
            )
        return code if outcome != "stopped" else EXIT_STOPPED

    def _write_end(self, outcome: str, failure: Failure | None) -> None:
        """Node rank 0: the run's status word from every host's exit it heard of, the report of
        a completed run, then the final progress.json (what the follower waits for)."""
        cfg, hosts = self.cfg, self.starts.hosts
        outcomes = {cfg.hosts[n]: rec.get("outcome") for n, rec in self.peers.exits.items()}
        status = run_status(hosts, {**outcomes, cfg.host: outcome}, failure is not None)
        if status == "completed":
            self.records.write_report(cfg.run_id, hosts, cfg.nproc, cfg.straggler_ratio)
        record = self._progress_record(time.time(), "ended", status)
        self.records.write_progress(record, final=True)

    def _write_summary(self, outcome: str, standing: Standing, escalated: bool = False) -> None:
        cfg, failure, records = self.cfg, standing.failure, self.records
        if outcome == "stopped" and self.peers.leads and escalated:
            records.write_stopped(cfg.attempt)
        if outcome != "failed" or not failure:
            return
        if self.peers.leads:
            records.write_failure(
                cfg.run_id, cfg.attempt, failure, cfg.log_tail_lines, standing.diagnosis
            )
        if self.peers.leads or standing.store_ok:
            return
        # The store's host is gone or this host is cut off: write the cause only if node rank 0
        # did not (it may still be there and have seen better).
        before = records.progress()
        if before.get("state") == "ended":
            return  # the run ended without this host (it was left out)
        if not records.storage_silent:
            time.sleep(max(cfg.settle * 2, 3 * PROGRESS_EVERY))
            records.flush(cfg.storage_timeout)
        summary = records.summary()
        if records.storage_silent:
            return  # the storage went with node rank 0's host: nothing can be written
        if summary.get("attempt") != cfg.attempt or "failure" not in summary:
            records.write_failure(cfg.run_id, cfg.attempt, failure, cfg.log_tail_lines)
            records.write_attempts(self.starts.attempts, self.starts.restarts, keep_part=True)
        self._stand_in_for_rank0(before)

    def _stand_in_for_rank0(self, before: dict) -> None:
        """progress.json unchanged while node rank 0's agent would have rewritten it (every
        PROGRESS_EVERY s): that agent is gone, so say in its place that the run failed (a cut
        off host sees it change and leaves it to node rank 0)."""
        cfg, now = self.cfg, self.records.progress()
        ended = now.get("attempt") == cfg.attempt and now.get("state") == "ended"
        if self.records.storage_silent or now != before or ended:
            return
        record = {**now, "run_id": cfg.run_id, "attempt": cfg.attempt, "state": "ended"}
        self.records.write_progress({**record, "status": "failed", "time": time.time()}, final=True)

    def _write_program_summary(self, outcome: str, mine: dict) -> None:
        cfg, exits = self.cfg, {**self.peers.exits, self.cfg.node_rank: mine}
        hosts = {}
        for node, name in enumerate(cfg.hosts):
            rec = exits.get(node, {})  # none: the host was left out of the run, or is unheard of
            absent = "no exit record" if node in self.peers.members else "left out"
            hosts[name] = {"exit_code": rec.get("exit_code"), "outcome": rec.get("outcome", absent)}
        started, attempts = self.ranks.started or time.time(), self.starts.attempts
        world = attempts[-1]["world_size"] if attempts else cfg.world_size
        facts = {
            "program": cfg.program,
            "world_size": world,
            "hosts": hosts,
            "started_at": started,
            "ended_at": mine["time"],
            "wall_time_sec": round(mine["time"] - started, 1),
        }
        self.records.write_program_summary(
            cfg.run_id, cfg.attempt, outcome, facts, cfg.log_tail_lines
        )

    def _wait_for_peers(self, outcome: str, failure: Failure | None) -> None:
        """Serve the store until every other agent reported its exit, up to peer_timeout. After
        a failure, hosts already silent (or named as gone by it) are not waited for; after a
        completed run every host is: a loaded host's agent can be seconds late, and skipping
        it left it "running" in the final progress.json (seen with a 2-core host busy)."""
        gone: set[int] = set()
        if outcome != "completed":
            gone.update(self.peers.silent(time.time(), self.cfg.settle))
        if failure and failure.get("exit_code") is None:
            gone.add(int(failure.get("node_rank", -1)))
        deadline = time.time() + self.cfg.peer_timeout
        while time.time() < deadline:
            try:
                self.peers.exchange(self.ranks.record("exited"))
            except StoreLost:
                return
            waiting = [n for n in self.peers.members if n != self.cfg.node_rank]
            if all(n in self.peers.exits or n in gone for n in waiting):
                return
            time.sleep(self.cfg.tick)

    def progress(self, now: float) -> None:
        """Node rank 0 keeps progress.json current (every PROGRESS_EVERY s)."""
        if not self.peers.leads or now - self.last_progress < PROGRESS_EVERY:
            return
        self.last_progress = now
        self.records.write_progress(self._progress_record(now, "running"))

    def _progress_record(self, now: float, state: str, status: str = "running") -> dict:
        cfg, peers = self.cfg, self.peers
        lead = (peers.views.get(peers.members[0], {}).get("ranks") or [{}])[0]
        step, total = int(lead.get("step") or 0), int(lead.get("total_steps") or 0)
        eta = None
        if lead.get("phase") in ("train", "validate"):
            start = len(self.starts.attempts)  # counted from this start's first step seen
            if self.first_train is None or self.first_train[2] != start:
                self.first_train = (now, step, start)
            t0, s0, _ = self.first_train
            if step > s0 and total:
                eta = round((total - step) * (now - t0) / (step - s0), 1)
        hosts = {}
        for node, name in enumerate(cfg.hosts):
            if node in peers.exits or peers.views.get(node, {}).get("state") == "exited":
                hosts[name] = "exited"
            elif node not in peers.members:
                hosts[name] = "left out"
            elif node not in peers.seen:
                hosts[name] = "starting"
            else:
                silent = now - peers.seen[node][1] > max(3 * cfg.tick, 5.0)
                hosts[name] = "silent" if silent else "running"
        return {
            "run_id": cfg.run_id,
            "attempt": cfg.attempt,
            "state": state,
            "status": status,
            "time": now,
            "step": step,
            "total_steps": total,
            **{k: lead.get(k) for k in ("epoch", "phase", "loss", "images_per_sec")},
            "eta_sec": eta,
            "hosts": hosts,
            "elapsed_sec": round(now - self.ranks.started, 1) if self.ranks.started else 0.0,
            "program": cfg.program,
            "restarts": self.starts.restarts,
            "attempts": [dict(a) for a in self.starts.attempts],
        }
