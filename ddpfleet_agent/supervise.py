"""The agent's supervision loop: start the command, watch it and the peers, end the run."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from types import FrameType

from ddpfleet_agent import bundle, failures, machine
from ddpfleet_agent.cli import AgentConfig
from ddpfleet_agent.ending import Ending
from ddpfleet_agent.failover import Heal
from ddpfleet_agent.failures import Failure
from ddpfleet_agent.judging import Judge, claim
from ddpfleet_agent.machine import Action, Began, Do, Ended, Facts, Reported, Standing, State
from ddpfleet_agent.peers import Peers, StoreLost
from ddpfleet_agent.ranks import LocalRanks
from ddpfleet_agent.records import Records
from ddpfleet_agent.regrow import Lead
from ddpfleet_agent.restarts import Starts

CONFIG = ("node_rank", "can_fail_over", "takes_hosts_back", "restarts", "min_hosts")  # Facts'


class Agent:
    """Runs machine.py's transitions and carries each action out through the parts it builds;
    it alone holds the run's ``standing``, which the parts get and hand back, and its signals."""

    def __init__(self, cfg: AgentConfig, child_env: dict[str, str] | None = None):
        self.cfg = cfg
        env = dict(os.environ) if child_env is None else child_env
        self.records = Records(cfg.run_dir, cfg.host, cfg.fallback_dir, cfg.storage_timeout)
        hb_dir = Path(tempfile.mkdtemp(prefix="ddpfleet-heartbeat-"))
        self.ranks = ranks = LocalRanks(hb_dir, self.records.log)
        self.peers = peers = Peers(cfg, self.say)
        self.judge = Judge(cfg, peers, ranks)
        records, say, stopped = self.records, self.say, lambda: bool(self.signum)
        self.starts = starts = Starts(cfg, peers, ranks, judge=self.judge, env=env, say=say)
        self.lead = Lead(cfg, peers, say)
        self.heal = Heal(cfg, peers, ranks, records, starts, say, stopped)
        self.ending = Ending(cfg, peers, ranks, records=records, starts=starts, say=say)
        self.standing = Standing()
        self.signum, self.stopping_since, self.escalated = 0, 0.0, False

    def say(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        line = f"ddpfleet agent: {stamp} {self.cfg.host}: {text}"
        print(line, flush=True)
        self.records.log(line)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = self.signum or signum

    def run(self) -> int:
        """Supervise the run; an error of the agent's own ends it as a failure naming this
        host, with the traceback in nodes/<host>.log, instead of a container gone silently."""
        try:
            return self._run()
        except Exception as exc:  # the last line of defence, recorded below
            return self._crashed(exc)
        finally:  # the ranks are gone: their heartbeat files have been read for the last time
            shutil.rmtree(self.ranks.heartbeat_dir, ignore_errors=True)

    def _crashed(self, exc: Exception) -> int:
        for line in traceback.format_exc().rstrip().splitlines():
            self.say(line)
        reason = f"its ddpfleet agent failed ({type(exc).__name__}: {exc})"
        failure = self.judge.failure(self.cfg.node_rank, reason[:500])
        self.standing = replace(self.standing, failure=failure)
        try:
            if self.standing.store_ok:
                self.standing = claim(self.peers, self.standing, failure)
            return self._finish("failed", 1)
        except Exception:  # the ranks must not outlive the agent either way
            self.ranks.kill_all()
            self.records.flush(30.0)
            return 1

    def _run(self) -> int:
        cfg = self.cfg
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        command = " ".join(cfg.command)
        self.say(f"node_rank {cfg.node_rank} of {len(cfg.hosts)}, attempt {cfg.attempt}: {command}")
        try:
            self.peers.read_key()
            moved_on = cfg.can_fail_over and self.heal.moved_on()
            if not moved_on:
                self.peers.connect()
        except StoreLost as exc:
            why = f"cannot reach the run's store at {cfg.store_host}:{cfg.store_port} ({exc})"
            self.standing = Standing(self.judge.failure(0, why), store_ok=False)
            return self._finish("failed", 1)
        if cfg.metrics_port and (why := self._serve_metrics()):
            self.say(why)  # the run goes on without its metrics
        # started again in a run that went on under another host's store, or in the run
        again = moved_on or bool(cfg.node_rank and self.peers.ran_before())
        state, event = State.STARTING, Began(self._facts("left out"), again)
        code = 1
        while True:
            state, actions = machine.transition(state, event)
            regrouped = False
            for do in actions:
                if do.action is Action.FINISH:
                    return self._finish(do.text, code)
                regrouped = self._carry_out(do)
            if state is State.RUNNING:
                outcome, code = self._supervise()
                event = Ended(self._facts(outcome), self.standing.failure)
            else:
                event = Reported(self._facts(event.facts.outcome), regrouped)

    def _facts(self, outcome: str) -> Facts:
        standing, config = self.standing, {k: getattr(self.cfg, k) for k in CONFIG}
        return Facts(
            outcome=outcome,
            signalled=bool(self.signum),
            store_ok=standing.store_ok,
            left_out=standing.left_out,
            earlier=tuple(self.starts.causes),
            members=len(self.peers.members),
            **config,
        )

    def _carry_out(self, do: Do) -> bool:
        """One of the machine's actions: True when this host's ranks run (again)."""
        standing, started = self.standing, False
        if do.action is Action.REFUSE:  # why the failed run was not restarted
            cause = standing.failure or {}
            failure = {**cause, "reason": f"{cause.get('reason')}; {do.text}"}
            self.standing = replace(standing, failure=failure)
        elif do.action is Action.LEAVE:  # not in the run's generation until it is let back
            self.standing = replace(standing, left_out=True)
        elif do.action is Action.CLAIM:
            mine = self.judge.failure(self.cfg.node_rank, do.text)
            self.standing = claim(self.peers, standing, mine)
        elif do.action is Action.START:
            self.starts.start()
            started = True
        else:  # the generation's ranks end first, their last output drained
            self.ranks.end()
            heal = {
                Action.FAIL_OVER: self.heal.failed_over,
                Action.RESTART: self.starts.restarted,
                Action.REGROW: self.heal.regrown,
                Action.REJOIN: lambda at: self.heal.rejoined(at, do.text == "again"),
            }
            started, self.standing = heal[do.action](standing)
        if started:  # a new start of the ranks
            self.lead.restarted()
        return started

    def _serve_metrics(self) -> str:
        """Start the Prometheus endpoint; why not, in one line ('' when it serves)."""
        try:  # a user's image (train_program) may lack prometheus_client
            from ddpfleet_agent import exporter  # noqa: PLC0415
        except ImportError as exc:
            return f"no metrics endpoint: {exc}"
        starts, ranks, lead = self.starts, self.ranks, self.lead
        return exporter.serve(
            self.cfg, lambda: (starts.restarts, ranks.started, ranks.beats, lead.speed())
        )

    def _finish(self, outcome: str, code: int) -> int:
        return self.ending.finish(outcome, code, self.standing, self.escalated)

    def _supervise(self) -> tuple[str, int]:
        cfg = self.cfg
        while True:
            now = time.time()
            code = self.ranks.poll()
            try:
                record = self.ranks.record("exited" if code is not None else "running")
                failure, stop = self.peers.exchange(record)
            except StoreLost as exc:
                self.standing = replace(self.standing, store_ok=False)
                if code == 0:
                    return "completed", 0
                failure, code = self.judge.store_lost(exc), 1  # its ranks are ended as failed
            if failure is not None:
                self._end_ranks(replace(self.standing, failure=failure))
                return ("completed", 0) if code == 0 else ("failed", code or 1)
            if (self.signum or stop) and not self.stopping_since:
                self._begin_stop(stop)
            elif self.stopping_since and not self.escalated:
                self._stop_late_ranks()
            if code is not None:
                stopping = bool(self.stopping_since)
                outcome, code, self.standing = self.judge.ended(code, self.standing, stopping)
                return outcome, code
            self.starts.track(now)
            self.ending.progress(now)
            # a stop ends the ranks, bounded by the stop timeout: nothing to judge (peers' ranks
            # ending age, and node rank 0 must not end the generation to regrow or rebalance)
            problem = None if self.stopping_since else self._check(now)
            if problem is not None and problem.get("cut_off"):  # judging.Judge.check
                self.standing = self.heal.step_down(problem, self.standing)
                return "failed", 1
            if problem is not None:
                self._end_ranks(claim(self.peers, self.standing, problem))
                return "failed", self.ranks.poll() or 1
            late = self.stopping_since and now - self.stopping_since > cfg.stop_timeout
            if late and not self.escalated:
                self.say(f"ranks still running {cfg.stop_timeout:.0f}s after the stop: SIGKILL")
                self.escalated = True
                self.ranks.kill_all()
            time.sleep(cfg.tick)

    def _check(self, now: float) -> Failure | None:
        """A failure seen while the ranks run, or node rank 0's planned end of a generation."""
        found = self.judge.check(now, self.starts.began() or now) or self.lead.regrow(now)
        return found or self.lead.rebalance(now, self.starts.weights)

    def _end_ranks(self, standing: Standing) -> None:
        """Kill the ranks of a failed run, after the forensics bundle of those still running."""
        failure = standing.failure or {}
        if self.ranks.poll() is None and not failures.planned(failure):  # nothing failed
            parts, label = (self.cfg, self.peers, self.ranks, self.records), self.starts.label
            diagnosis, store_ok = bundle.take(
                *parts, failure, say=self.say, label=label, store_ok=standing.store_ok
            )
            standing = replace(standing, diagnosis=diagnosis, store_ok=store_ok)
        self.standing = standing
        self.ranks.kill_all()

    def _stop_late_ranks(self) -> None:
        """SIGTERM the ranks torchrun started after the stop came (in its rendezvous)."""
        if late := self.ranks.signal_ranks(signal.SIGTERM):
            self.say(f"SIGTERM to ranks started after the stop {late}")

    def _begin_stop(self, stop: dict | None) -> None:
        self.stopping_since = time.time()
        if self.signum and stop is None:
            try:
                self.peers.request_stop(self.cfg.host)
            except StoreLost:
                self.standing = replace(self.standing, store_ok=False)
        by = (stop or {}).get("by", self.cfg.host)
        pids = self.ranks.signal_ranks(signal.SIGTERM)
        self.say(f"stop requested by {by}: SIGTERM to ranks {pids}")
