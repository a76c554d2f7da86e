"""summary.json, how a run ended: written once and whole at the run's end by the agent that
ends it (node rank 0's, or its stand-in: ``ending.py``), so a script that waits for its
``status`` reads the whole record. The trainer hands its part over in ``TRAINER_PART``, which the
agent merges (``merge``) and removes, so no later attempt merges it again; without an agent the
trainer writes summary.json itself.
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
ENDED_BY_TRAINER = ("stopped", "completed")  # a stop the agent forced then changes nothing


def write_trainer_summary(run_dir: Path, summary: dict) -> Path:
    """The trainer's summary (rank 0, at the end), on one line: ``TRAINER_PART`` under an agent
    (it sets $DDPFLEET_HEARTBEAT_DIR), else summary.json itself. Returns the path."""
    path = Path(run_dir) / (TRAINER_PART if os.environ.get(DIR_ENV) else SUMMARY)
    write_json_atomic(path, summary, indent=None)
    return path


def merge_base(run_dir: Path, attempt: str | None, program: bool) -> dict:
    """The trainer's part, else this attempt's summary.json (a stand-in ends after node rank 0's
    agent took the part); for a user's program, summary.json with any part over it (should the
    program have run ddpfleet's trainer; ``merge`` drops an earlier attempt's outcome)."""
    part, written = read_json(run_dir / TRAINER_PART), read_json(run_dir / SUMMARY)
    if program:
        return {**written, **part}
    if part:
        return part
    return written if attempt and written.get("attempt") == attempt else {}


def merge(base: dict, ending: dict, attempts: list[dict], restarts: int) -> dict:
    """``base`` with the run's ending (``Records``' notes) over it. A failure makes it failed;
    a stop marks it stopped unless the trainer recorded the stop or completion of this attempt;
    a program's status is its outcome unless a failure of this attempt is recorded."""
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
    elif "stopped_at" in ending and not (same and summary.get("status") in ENDED_BY_TRAINER):
        summary.update(status="stopped", stopped_by="agent", stopped_at=ending["stopped_at"])
    program = ending.get("program")
    if program is not None:
        failed = summary.get("status") == "failed" and "failure" in summary
        summary.update(program["facts"], run_id=ending.get("run_id"))
        summary["status"] = "failed" if failed else program["outcome"]
    if attempt:
        summary["attempt"] = attempt
    summary.update(attempts=[dict(a) for a in attempts], restarts=restarts)
    return summary | wall_time(summary, attempts)


def wall_time(summary: dict, attempts: list[dict]) -> dict:
    """A run with more than one start: its wall time is from the first start to the end of the
    last (the trainer's, or a program's, counts the last start alone: it is kept as
    ``last_start_wall_time_sec``); {} where a time is not known."""
    if len(attempts) < 2 or "wall_time_sec" not in summary:
        return {}
    begun, ended = attempts[0].get("started"), attempts[-1].get("ended")
    if not begun or not ended:
        return {}
    return {"wall_time_sec": round(ended - begun, 1),
            "last_start_wall_time_sec": summary["wall_time_sec"]}  # fmt: skip
