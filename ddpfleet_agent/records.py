"""What the agent writes in the run directory, off the supervision loop's thread, and the
one writer of ``summary.json``: the trainer's rank 0 writes its summary through
``write_trainer_summary``; the agent merges a run's outcome into it (``Records``).

Shared storage can stall (a hard NFS mount blocks): every agent write goes through one writer
thread, so supervision never waits on it; ``flush`` waits a bounded time at the end, and a read
(``summary``, ``progress``) waits at most ``read_timeout`` s. The host's log and exit record
also go to a host-local fallback directory (``<host>.log``, ``<host>.exit``), written at once:
what status.yml reads when the storage is gone.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from pathlib import Path

from ddpfleet_agent.files import (
    STORAGE_READ_TIMEOUT,
    append_line,
    read_json,
    read_json_within,
    tail_lines,
    write_json_atomic,
)


def write_trainer_summary(run_dir: Path, summary: dict) -> None:
    """The trainer's summary.json (rank 0, at the end of a run), written whole, on one line;
    the agents then merge the run's outcome into it."""
    write_json_atomic(Path(run_dir) / "summary.json", summary, indent=None)


def cause_line(run_id: str, failure: dict) -> str:
    """The one line a failed run is known by."""
    where = f"host {failure.get('host')} rank {failure.get('rank')}"
    return f"run {run_id} failed: {where}: {failure.get('reason')}"


class Records:
    """nodes/<host>.log|.exit, summary.json and progress.json of one run directory."""

    def __init__(
        self,
        run_dir: str,
        host: str,
        fallback_dir: str = "",
        read_timeout: float = STORAGE_READ_TIMEOUT,
    ):
        self.run_dir = Path(run_dir)
        self.host = host
        self.fallback = Path(fallback_dir) if fallback_dir else None
        # an earlier attempt's exit record would read as this one's until this one ends
        self._local(lambda d: (d / f"{host}.exit").unlink(missing_ok=True))
        self.nodes = self.run_dir / "nodes"
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()
        self._log = None
        self.pending_progress = False
        self.read_timeout = read_timeout
        self.storage_silent = False  # a read timed out: no more reads of the shared storage

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                job()
            except OSError as exc:  # shared storage trouble must not end supervision
                with contextlib.suppress(OSError):
                    os.write(2, f"ddpfleet agent: write failed: {exc}\n".encode())
            finally:
                self._queue.task_done()

    def submit(self, job) -> None:
        self._queue.put(job)

    def flush(self, timeout: float) -> bool:
        """Wait up to timeout s for every queued write; False when storage did not answer."""
        done = threading.Event()
        self._queue.put(done.set)
        if done.wait(timeout):
            return True
        self.storage_silent = True
        return False

    def log(self, line: str) -> None:
        """Append to nodes/<host>.log (queued) and to the fallback's <host>.log (at once)."""
        self.submit(lambda: self._append(line))
        self._local(lambda d: append_line(d / f"{self.host}.log", line))

    def _local(self, write) -> None:
        """A write to the host-local fallback directory: never fails the agent."""
        if self.fallback is None:
            return
        try:
            write(self.fallback)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.write(2, f"ddpfleet agent: fallback write failed: {exc}\n".encode())

    def _append(self, line: str) -> None:
        if self._log is None:
            self.nodes.mkdir(parents=True, exist_ok=True)
            fd = os.open(
                self.nodes / f"{self.host}.log",
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                0o644,
            )
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
        """Queue a progress.json rewrite unless the last one is still waiting for storage (the
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
        return self._read("summary.json")

    def progress(self) -> dict:
        return self._read("progress.json")

    def _read(self, name: str) -> dict:
        """A record of the run directory, read within ``read_timeout`` s; {} when the storage
        did not answer (then ``storage_silent``, said once on stderr, and no read waits again)."""
        if self.storage_silent:
            return {}
        got = read_json_within(self.run_dir / name, self.read_timeout)
        if got is None:
            self.storage_silent = True
            with contextlib.suppress(OSError):
                os.write(2, f"ddpfleet agent: shared storage did not answer a read of {name} "
                            f"within {self.read_timeout:g} s\n".encode())  # fmt: skip
            return {}
        return got

    def write_report(self, run_id: str, hosts: list[str], nproc: int, ratio: float) -> None:
        """report.txt and report.png of a completed run (ddpfleet_agent.report), queued after
        the summary writes and before the final progress.json."""
        from ddpfleet_agent.report import write_report  # noqa: PLC0415 - report imports this

        def job() -> None:
            note = write_report(self.run_dir, run_id, hosts, nproc, ratio)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self._append(f"ddpfleet agent: {stamp} {self.host}: {note}")

        self.submit(job)

    def write_failure(
        self,
        run_id: str,
        attempt: str,
        failure: dict,
        tail_count: int,
        diagnosis: str | None = None,
    ) -> None:
        """Mark summary.json failed with the root cause (keeping what the trainer wrote) and,
        where the ranks were dumped, the diagnosis (where each was: forensics/<attempt>/)."""

        def job() -> None:
            path = self.run_dir / "summary.json"
            summary = read_json(path)
            failure_rec = dict(failure)
            rank = failure.get("rank")
            tail = (
                tail_lines(self.run_dir / "logs" / f"rank-{rank}.log", tail_count)
                if rank is not None
                else []
            )
            if not tail:
                tail = tail_lines(self.nodes / f"{failure.get('host')}.log", tail_count)
            failure_rec["log_tail"] = tail
            summary.update(
                status="failed",
                failure=failure_rec,
                cause=cause_line(run_id, failure),
                attempt=attempt,
            )
            summary.pop("diagnosis", None)  # an earlier attempt's
            if diagnosis:
                summary["diagnosis"] = diagnosis
            write_json_atomic(path, summary)

        self.submit(job)

    def write_attempts(self, attempts: list[dict], restarts: int) -> None:
        """The run's starts (restarts.py) and how many were restarts after a failure (not a
        host taken back: regrow.py) into the summary its last start left."""
        rows = [dict(a) for a in attempts]

        def job() -> None:
            path = self.run_dir / "summary.json"
            summary = read_json(path)
            if summary:  # none: the run ended before anything wrote one
                summary.update(attempts=rows, restarts=restarts)
                write_json_atomic(path, summary)

        self.submit(job)

    def write_stopped(self, attempt: str) -> None:
        """Mark summary.json stopped when the trainer could not (it was killed at escalation)."""

        def job() -> None:
            path = self.run_dir / "summary.json"
            summary = read_json(path)
            if (
                summary.get("status") in ("stopped", "completed")
                and summary.get("attempt", attempt) == attempt
            ):
                return
            summary.update(
                status="stopped", stopped_by="agent", stopped_at=time.time(), attempt=attempt
            )
            write_json_atomic(path, summary)

        self.submit(job)

    def write_program_summary(
        self, run_id: str, attempt: str, outcome: str, facts: dict, tail_count: int
    ) -> None:
        """summary.json for a user's program (which writes none of ours): the outcome unless a
        failure of this attempt is recorded, the facts (program, world size, times, each host's
        exit) and each host's log tail. Keys the program wrote itself are kept; an earlier
        attempt's failure is dropped."""

        def job() -> None:
            path = self.run_dir / "summary.json"
            summary = read_json(path)
            if summary.get("attempt") != attempt:
                for stale in ("failure", "cause", "stopped_by", "stopped_at"):
                    summary.pop(stale, None)
            failed_here = summary.get("status") == "failed" and "failure" in summary
            hosts = {
                host: {**rec, "log_tail": tail_lines(self.nodes / f"{host}.log", tail_count)}
                for host, rec in facts.pop("hosts").items()
            }
            summary.update(facts, run_id=run_id, attempt=attempt, hosts=hosts)
            summary["status"] = "failed" if failed_here else outcome
            write_json_atomic(path, summary)

        self.submit(job)
