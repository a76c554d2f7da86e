#!/usr/bin/python
"""Record how a run ended in its summary.json: the failure's root cause, or `stopped`."""

from __future__ import annotations

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ddpfleet_run import (
    as_owner,
    cause_line,
    read_json,
    read_markers,
    read_text,
    root_cause,
    tail_lines,
    write_atomic,
)

DOCUMENTATION = r"""
module: ddpfleet_run_finalize
short_description: Rewrite summary.json of a failed or stopped ddpfleet run
description:
- With C(outcome=failed), picks the earliest C(nodes/<host>.failed) marker as the root cause,
  adds the last lines of that rank's log, and writes C(status=failed) with C(failure) into
  summary.json (keeping the trainer's other fields).
- With C(outcome=stopped), marks the run C(stopped) unless the trainer already wrote C(stopped)
  or the run C(completed) before the stop.
options:
  run_dir:
    description: Run directory.
    type: path
    required: true
  run_id:
    description: The run id.
    type: str
    required: true
  outcome:
    description: How the run ended.
    type: str
    required: true
    choices:
    - failed
    - stopped
  log_lines:
    description: Lines of the failing rank's log to keep.
    type: int
    default: 20
  uid:
    description: Owner uid of the run directory.
    type: int
  gid:
    description: Owner gid of the run directory.
    type: int
author: ddpfleet
"""

RETURN = r"""
status:
  description: The status summary.json now holds.
  type: str
  returned: always
cause:
  description: One-line root cause (outcome=failed).
  type: str
  returned: when failed
failure:
  description: host, rank, exit_code, reason, log_tail.
  type: dict
  returned: when failed
"""


def write_summary(path: str, summary: dict) -> bool:
    return write_atomic(path, (json.dumps(summary, indent=2) + "\n").encode())


def mark_stopped(run_dir: str) -> dict:
    """status stopped, unless the trainer already wrote stopped or the run completed."""
    path = os.path.join(run_dir, "summary.json")
    summary = read_json(path) or {}
    if summary.get("status") in ("stopped", "completed"):
        return {"changed": False, "status": summary["status"]}
    summary.update(status="stopped", stopped_by="stop.yml", stopped_at=time.time())
    write_summary(path, summary)
    return {"changed": True, "status": "stopped"}


def mark_failed(run_dir: str, run_id: str, log_lines: int) -> dict:
    """status failed with the earliest failure marker as the root cause."""
    marker = root_cause(read_markers(run_dir))
    if marker is None:
        return {"msg": f"run {run_id}: no failure marker found in {run_dir}/nodes"}
    rank = marker.get("rank")
    log = read_text(os.path.join(run_dir, "logs", f"rank-{rank}.log"))
    if not log.strip():
        log = read_text(os.path.join(run_dir, "nodes", f"{marker.get('host')}.log"))
    failure = {
        "host": marker.get("host"),
        "rank": rank,
        "exit_code": marker.get("exit_code"),
        "reason": marker.get("reason"),
        "time": marker.get("failed_at") or marker.get("time"),
        "log_tail": tail_lines(log, log_lines),
    }
    cause = cause_line(run_id, marker)
    path = os.path.join(run_dir, "summary.json")
    summary = read_json(path) or {}
    summary.update(status="failed", failure=failure, cause=cause)
    changed = write_summary(path, summary)
    return {"changed": changed, "status": "failed", "cause": cause, "failure": failure}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run_dir": {"type": "path", "required": True},
            "run_id": {"type": "str", "required": True},
            "outcome": {"type": "str", "required": True, "choices": ["failed", "stopped"]},
            "log_lines": {"type": "int", "default": 20},
            "uid": {"type": "int"},
            "gid": {"type": "int"},
        },
        supports_check_mode=False,
    )
    p = module.params
    # Exit only outside as_owner: Ansible's exit handling needs root's view of its temp files.
    with as_owner(p["uid"], p["gid"]):
        if p["outcome"] == "stopped":
            result = mark_stopped(p["run_dir"])
        else:
            result = mark_failed(p["run_dir"], p["run_id"], p["log_lines"])
    if "msg" in result:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
