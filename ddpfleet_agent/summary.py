"""summary.json, how a run ended: one record, written once, whole (a temp file, then
``os.replace``), by the agent that ends the run: node rank 0's, or, when that host is gone, the
one that stands in for it (``ending.py``). Nothing writes it while the run goes, so a script
that waits for its ``status`` reads the whole record, ``attempts`` included.

ddpfleet's trainer hands its part over in ``summary.trainer.json`` (``TRAINER_PART``: rank 0,
at the end of each start of the ranks). At the run's end the agent merges that part, the run's
outcome (a failure, a stop it forced, a user's program's facts) and the attempts into one dict
(``merge``) and writes it (``records.Records.write_attempts``); node rank 0's agent then
removes the part, so that a later attempt of the run never merges it again. A user's program
(``--program``) writes no part (``merge_base``); the trainer without an agent writes
summary.json itself (``write_trainer_summary``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ddpfleet_agent.ddpfleet_heartbeat import DIR_ENV
from ddpfleet_agent.files import read_json, write_json_atomic

SUMMARY = "summary.json"
TRAINER_PART = "summary.trainer.json"
# What an earlier attempt's summary said of how it ended, not carried into this one's
EARLIER = ("failure", "cause", "diagnosis", "stopped_by", "stopped_at")


def write_trainer_summary(run_dir: Path, summary: dict) -> Path:
    """The trainer's summary (rank 0, at the end), on one line: under an agent (it sets
    $DDPFLEET_HEARTBEAT_DIR) its part, ``TRAINER_PART``, which the agent merges into
    summary.json at the run's end; without one, summary.json itself. Returns the path."""
    path = Path(run_dir) / (TRAINER_PART if os.environ.get(DIR_ENV) else SUMMARY)
    write_json_atomic(path, summary, indent=None)
    return path


def merge_base(run_dir: Path, attempt: str | None, program: bool) -> dict:
    """What the agent's summary starts from: the trainer's part, or, when node rank 0's agent
    took it already, the summary.json of this attempt (a stand-in ends after it). For a user's
    program, the summary.json there (keys the program wrote, or an earlier attempt's: ``merge``
    drops its outcome), with a part over it should the program have run ddpfleet's trainer."""
    part, written = read_json(run_dir / TRAINER_PART), read_json(run_dir / SUMMARY)
    if program:
        return {**written, **part}
    if part:
        return part
    return written if attempt and written.get("attempt") == attempt else {}


def merge(base: dict, ending: dict, attempts: list[dict], restarts: int) -> dict:
    """The summary: ``base`` with the run's ending over it. ``ending`` (Records' notes):
    attempt; and where they apply run_id, failure (its log tail in), cause, diagnosis (where
    the ranks were), stopped_at (the agent killed the ranks of a stop), program (a user's
    program: outcome and facts, each host's log tail in). A failure makes it failed; a stop
    marks it stopped unless the trainer recorded the stop or completion of this attempt; a
    program's status is its outcome unless a failure of this attempt is recorded."""
    summary, attempt = dict(base), ending.get("attempt")
    same = summary.get("attempt", attempt) == attempt  # the trainer's part names none
    if summary.get("attempt") != attempt:
        for key in EARLIER:
            summary.pop(key, None)
    if ending.get("failure") is not None:
        summary.update(status="failed", failure=ending["failure"], cause=ending.get("cause"))
        summary.pop("diagnosis", None)
        if ending.get("diagnosis"):
            summary["diagnosis"] = ending["diagnosis"]
    elif "stopped_at" in ending and not (
        same and summary.get("status") in ("stopped", "completed")
    ):
        summary.update(status="stopped", stopped_by="agent", stopped_at=ending["stopped_at"])
    program = ending.get("program")
    if program is not None:
        failed = summary.get("status") == "failed" and "failure" in summary
        summary.update(program["facts"], run_id=ending.get("run_id"))
        summary["status"] = "failed" if failed else program["outcome"]
    if attempt:
        summary["attempt"] = attempt
    summary.update(attempts=[dict(a) for a in attempts], restarts=restarts)
    return summary
