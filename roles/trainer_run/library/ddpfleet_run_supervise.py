#!/usr/bin/python
"""Supervise this host's container of a ddpfleet run until it ends or the run fails."""

from __future__ import annotations

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ddpfleet_run import (
    as_owner,
    cause_line,
    container_state,
    describe_exit,
    global_ranks,
    parse_root_cause,
    read_heartbeats,
    read_markers,
    read_text,
    stalled_rank,
    write_atomic,
)

DOCUMENTATION = r"""
module: ddpfleet_run_supervise
short_description: Watch one host's trainer container, its ranks' heartbeats and peers' failures
description:
- Polls C(docker inspect) of the container, the heartbeats of the host's own ranks and the
  failure markers of every host in the run directory.
- Returns C(outcome=completed) when the container exited 0, C(outcome=peer_failed) when another
  host wrote a failure marker, and fails after writing C(nodes/<host>.failed) when the container
  exited non-zero, disappeared, or one of its ranks' heartbeat stalled.
options:
  name:
    description: Container name.
    type: str
    required: true
  run_dir:
    description: Run directory on shared storage.
    type: path
    required: true
  host:
    description: inventory_hostname of this host.
    type: str
    required: true
  node_rank:
    description: This host's node rank.
    type: int
    required: true
  nproc_per_node:
    description: Ranks per host.
    type: int
    required: true
  heartbeat_timeout:
    description: Seconds without a heartbeat before a rank counts as stalled.
    type: float
    default: 180
  poll_interval:
    description: Seconds between polls.
    type: float
    default: 1
  max_runtime:
    description: Give up (fail) after this many seconds; 0 means never.
    type: float
    default: 0
  kill_on_failure:
    description: docker rm --force this host's container as soon as the run failed.
    type: bool
    default: true
  uid:
    description: Owner uid of the shared run directory.
    type: int
  gid:
    description: Owner gid of the shared run directory.
    type: int
author: ddpfleet
"""

RETURN = r"""
outcome:
  description: completed
  stopped (stop.yml asked) or peer_failed.: null
  type: str
  returned: success
marker:
  description: The failure marker written or seen.
  type: dict
  returned: on failure
"""


def inspect(module: AnsibleModule, name: str) -> dict | None:
    rc, out, err = module.run_command(["docker", "inspect", "--type", "container", name])
    if rc != 0:
        if "no such" in (err + out).lower():
            return None
        module.fail_json(msg=f"docker inspect {name} failed: {err.strip()}")
    data = json.loads(out)
    return data[0] if data else None


def kill(module: AnsibleModule, name: str) -> None:
    """SIGKILL and remove the container now (its state is already in the marker, if any)."""
    module.run_command(["docker", "rm", "--force", name])


def own_failure(module: AnsibleModule, p: dict, ranks: list[int], began: float) -> dict:
    """Look at this host's container and heartbeats once.

    Returns {} while all is well, {"outcome": ...} when the container ended cleanly or by
    stop.yml, or {"failure": {...}} when this host failed the run.
    """
    now = time.time()
    nodes = os.path.join(p["run_dir"], "nodes")
    state = container_state(inspect(module, p["name"]))
    if state["state"] in ("exited", "dead", "absent"):
        code = state["exit_code"]
        if code == 0:
            return {"outcome": "completed"}
        with as_owner(p["uid"], p["gid"]):
            if os.path.exists(os.path.join(nodes, "stop.requested")):
                return {"outcome": "stopped"}
            cause = parse_root_cause(read_text(os.path.join(nodes, f"{p['host']}.log")))
        if cause is not None and cause[0] in ranks:
            rank, reason = cause[0], f"rank {cause[0]} exited with code {cause[1]}"
        else:
            rank, reason = ranks[0], describe_exit(code, state.get("oom_killed", False))
        failed_at = state["finished_at"] or now
        return {
            "failure": {"rank": rank, "exit_code": code, "reason": reason, "failed_at": failed_at}
        }
    with as_owner(p["uid"], p["gid"]):
        beats = read_heartbeats(p["run_dir"], ranks)
    stall = stalled_rank(ranks, beats, state["started_at"] or began, now, p["heartbeat_timeout"])
    if stall is not None:
        return {
            "failure": {"rank": stall[0], "exit_code": None, "reason": stall[1], "failed_at": now}
        }
    if p["max_runtime"] and now - began > p["max_runtime"]:
        reason = f"still running after max_runtime {p['max_runtime']:.0f}s"
        return {
            "failure": {"rank": ranks[0], "exit_code": None, "reason": reason, "failed_at": now}
        }
    return {}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "run_dir": {"type": "path", "required": True},
            "host": {"type": "str", "required": True},
            "node_rank": {"type": "int", "required": True},
            "nproc_per_node": {"type": "int", "required": True},
            "heartbeat_timeout": {"type": "float", "default": 180},
            "poll_interval": {"type": "float", "default": 1},
            "max_runtime": {"type": "float", "default": 0},
            "kill_on_failure": {"type": "bool", "default": True},
            "uid": {"type": "int"},
            "gid": {"type": "int"},
        },
        supports_check_mode=False,
    )
    p = module.params
    ranks = global_ranks(p["node_rank"], p["nproc_per_node"])
    began = time.time()
    run_id = os.path.basename(p["run_dir"].rstrip("/"))
    while True:
        seen = own_failure(module, p, ranks, began)
        if "outcome" in seen:
            module.exit_json(changed=False, outcome=seen["outcome"], elapsed=time.time() - began)
        if "failure" in seen:
            marker = {"host": p["host"], "node_rank": p["node_rank"], "time": time.time()}
            marker.update(seen["failure"])
            path = os.path.join(p["run_dir"], "nodes", f"{p['host']}.failed")
            with as_owner(p["uid"], p["gid"]):
                write_atomic(path, (json.dumps(marker) + "\n").encode())
            if p["kill_on_failure"]:
                kill(module, p["name"])
            module.fail_json(msg=cause_line(run_id, marker), marker=marker, outcome="failed")
        with as_owner(p["uid"], p["gid"]):
            peers = [m for m in read_markers(p["run_dir"]) if m.get("host") != p["host"]]
        if peers:
            if p["kill_on_failure"]:
                kill(module, p["name"])
            module.exit_json(changed=False, outcome="peer_failed", marker=peers[0])
        time.sleep(p["poll_interval"])


if __name__ == "__main__":
    main()
