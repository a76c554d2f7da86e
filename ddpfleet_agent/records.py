"""What the agent writes in the run directory: its log and exit record, progress.json, the
report and, once at the run's end, summary.json (``summary.py``).

Shared storage can stall (a hard NFS mount blocks): every write goes through one writer thread,
so supervision never waits on it; ``flush`` waits a bounded time, a read ``read_timeout`` s at
most. The host's log and exit record also go at once to a host-local fallback directory
(``<host>.log``, ``<host>.exit``): what status.yml reads when the storage is gone.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from pathlib import Path
from typing import TextIO

from ddpfleet_agent.files import (
    STORAGE_READ_TIMEOUT,
    append_line,
    call_within,
    read_json,
    tail_lines,
    write_json_atomic,
)
from ddpfleet_agent.summary import SUMMARY, TRAINER_PART, merge, merge_base


def cause_line(run_id: str, failure: dict) -> str:
    """The one line a failed run is known by."""
    where = f"host {failure.get('host')} rank {failure.get('rank')}"
    return f"run {run_id} failed: {where}: {failure.get('reason')}"


def _say(text: str) -> None:  # on stderr, which may be gone too
    with contextlib.suppress(OSError):
        os.write(2, f"ddpfleet agent: {text}\n".encode())


class Records:
    """nodes/<host>.log|.exit, summary.json and progress.json of one run directory."""

    def __init__(
        self,
        run_dir: str,
        host: str,
        fallback_dir: str = "",
        read_timeout: float = STORAGE_READ_TIMEOUT,
    ):
        self.run_dir, self.host, self.read_timeout = Path(run_dir), host, read_timeout
        self.nodes = self.run_dir / "nodes"
        self.fallback = Path(fallback_dir) if fallback_dir else None
        # an earlier attempt's exit record would read as this one's until this one ends
        self._local(lambda d: (d / f"{host}.exit").unlink(missing_ok=True))
        self._queue: queue.Queue = queue.Queue()
        self._log: TextIO | None = None  # nodes/<host>.log, opened on the first line
        threading.Thread(target=self._work, daemon=True).start()
        self.pending_progress = False
        self.storage_silent = False  # a read timed out: no more reads of the shared storage
        self.ending: dict = {}  # what summary.json will say of the run's end (write_attempts)

    def _work(self) -> None:
        for job in iter(self._queue.get, None):
            try:
                job()
            except OSError as exc:  # shared storage trouble must not end supervision
                _say(f"write failed: {exc}")

    def submit(self, job) -> None:
        self._queue.put(job)

    def flush(self, timeout: float) -> bool:
        """Wait up to timeout s for every queued write; False when storage did not answer."""
        done = threading.Event()
        self._queue.put(done.set)
        answered = done.wait(timeout)
        self.storage_silent = self.storage_silent or not answered
        return answered

    def storage_back(self) -> None:
        """This host is back on the network: its shared storage may answer again."""
        self.storage_silent = False

    def log(self, line: str) -> None:
        """Append to nodes/<host>.log (queued) and to the fallback's <host>.log (at once)."""
        self.submit(lambda: self._append(line))
        self._local(lambda d: append_line(d / f"{self.host}.log", line))

    def _local(self, write) -> None:
        """A write to the host-local fallback directory: never fails the agent."""
        try:
            if self.fallback is not None:
                write(self.fallback)
        except OSError as exc:
            _say(f"fallback write failed: {exc}")

    def _append(self, line: str) -> None:
        """Every line the ranks print comes here: the log stays open, not opened per line on
        the shared storage."""
        if self._log is None:
            self.nodes.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
            fd = os.open(self.nodes / f"{self.host}.log", flags, 0o644)
            self._log = os.fdopen(fd, "a", encoding="utf-8")
        self._log.write(line if line.endswith("\n") else line + "\n")
        self._log.flush()

    def write_exit(self, record: dict) -> None:
        """nodes/<host>.exit (queued) and the fallback's <host>.exit (at once)."""
        self.submit(lambda: write_json_atomic(self.nodes / f"{self.host}.exit", record))
        self.write_local_exit(record)

    def write_local_exit(self, record: dict) -> None:
        self._local(lambda d: write_json_atomic(d / f"{self.host}.exit", record))

    def write_progress(self, progress: dict, final: bool = False) -> None:
        """Queue a progress.json rewrite unless the last one still waits for the storage (the
        final record, which has the run's status word, is queued all the same)."""
        if self.pending_progress and not final:
            return
        self.pending_progress = True

        def job() -> None:
            try:
                write_json_atomic(self.run_dir / "progress.json", progress)
            finally:
                self.pending_progress = False

        self.submit(job)

    def summary(self) -> dict:
        return self._read(SUMMARY)

    def progress(self) -> dict:
        return self._read("progress.json")

    def _read(self, name: str) -> dict:
        """A record read within ``read_timeout`` s; {} when the storage did not answer (then
        ``storage_silent``, said once on stderr, and no read waits again)."""
        if self.storage_silent:
            return {}
        got = call_within(lambda: read_json(self.run_dir / name), self.read_timeout)
        if not got:
            self.storage_silent = True
            _say(f"shared storage did not answer a read of {name} within {self.read_timeout:g} s")
        return got[0] if got else {}

    def write_report(self, run_id: str, hosts: list[str], nproc: int, ratio: float) -> None:
        """report.txt and report.png, queued after the summary and before the final progress."""
        from ddpfleet_agent.report import write_report  # noqa: PLC0415 - report imports this

        def job() -> None:
            note = write_report(self.run_dir, run_id, hosts, nproc, ratio)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self._append(f"ddpfleet agent: {stamp} {self.host}: {note}")

        self.submit(job)

    # The write_* notes below gather what ``write_attempts`` puts in summary.json.
    def write_failure(
        self,
        run_id: str,
        attempt: str,
        failure: dict,
        tail_count: int,
        diagnosis: str | None = None,
    ) -> None:
        """The run's root cause: the failure, the failing rank's log tail (or its host's) and,
        where the ranks were dumped, the diagnosis (forensics/<attempt>/)."""
        cause = cause_line(run_id, failure)
        self.ending.update(run_id=run_id, attempt=attempt, failure=dict(failure), cause=cause)
        self.ending.update(diagnosis=diagnosis, tail_count=tail_count)

    def write_stopped(self, attempt: str) -> None:
        """The agent ended a stop by killing the ranks (unless the trainer recorded the stop)."""
        self.ending.update(attempt=attempt, stopped_at=time.time())

    def write_program_summary(
        self, run_id: str, attempt: str, outcome: str, facts: dict, tail_count: int
    ) -> None:
        """A user's program's facts (program, world size, times, each host's exit), outcome."""
        program = {"outcome": outcome, "facts": dict(facts)}
        self.ending.update(run_id=run_id, attempt=attempt, program=program, tail_count=tail_count)

    def write_attempts(self, attempts: list[dict], restarts: int, keep_part: bool = False) -> None:
        """Write summary.json, once and whole (``summary.merge``), then remove the trainer's
        part, consumed, unless ``keep_part`` (a stand-in for node rank 0's agent, which may
        still end after it). Nothing is written when no status is known."""
        rows, ending = [dict(a) for a in attempts], dict(self.ending)
        ending.setdefault("attempt", rows[-1]["attempt"] if rows else None)

        def job() -> None:
            start = merge_base(self.run_dir, ending.get("attempt"), "program" in ending)
            summary = merge(start, self._tails(ending), rows, restarts)
            if "status" not in summary:
                return
            write_json_atomic(self.run_dir / SUMMARY, summary)
            if not keep_part:
                (self.run_dir / TRAINER_PART).unlink(missing_ok=True)

        self.submit(job)

    def _tails(self, ending: dict) -> dict:
        """``ending`` with the failing rank's (else its host's) or each program host's log tail."""
        count, out = ending.get("tail_count", 0), dict(ending)

        def host_tail(host: object) -> list[str]:
            return tail_lines(self.nodes / f"{host}.log", count)

        failure = ending.get("failure")
        if failure is not None:
            rank = failure.get("rank")
            logs = self.run_dir / "logs" / f"rank-{rank}.log"
            tail = tail_lines(logs, count) if rank is not None else []
            out["failure"] = {**failure, "log_tail": tail or host_tail(failure.get("host"))}
        program = ending.get("program")
        if program is not None:
            facts = program["facts"]
            hosts = {h: {**r, "log_tail": host_tail(h)} for h, r in facts.get("hosts", {}).items()}
            out["program"] = {**program, "facts": {**facts, "hosts": hosts}}
        return out
