#!/usr/bin/python
"""Report one host's part of a ddpfleet run: containers, heartbeats, exit file, summary."""

from __future__ import annotations

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ddpfleet_run import (
    as_owner,
    container_state,
    global_ranks,
    read_heartbeats,
    read_json,
    read_metrics,
)

DOCUMENTATION = r"""
module: ddpfleet_run_state
short_description: Read the state of a ddpfleet run on one host (changes nothing)
options:
  run_id:
    description: The run id (container label io.ddpfleet.run_id).
    type: str
    required: true
  run_dir:
    description: Run directory.
    type: path
    required: true
  host:
    description: inventory_hostname.
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
  read_summary:
    description: Also read summary.json and the last metrics record.
    type: bool
    default: false
  uid:
    description: Owner uid of the run directory.
    type: int
  gid:
    description: Owner gid of the run directory.
    type: int
author: ddpfleet
"""

RETURN = r"""
containers:
  description: name, state, exit_code of each container labelled with the run id.
  type: list
  returned: always
running:
  description: Whether any of them is running.
  type: bool
  returned: always
heartbeats:
  description: rank, step, age_sec of this host's ranks.
  type: list
  returned: always
exit:
  description: Content of nodes/<host>.exit, if any.
  type: str
  returned: always
summary:
  description: summary.json (read_summary).
  type: dict
  returned: when read_summary
last_metrics:
  description: Last record of metrics.jsonl (read_summary).
  type: dict
  returned: when read_summary
"""


def containers(module: AnsibleModule, run_id: str) -> list[dict]:
    label = f"label=io.ddpfleet.run_id={run_id}"
    rc, out, err = module.run_command(["docker", "ps", "-aq", "--no-trunc", "--filter", label])
    if rc != 0:
        module.fail_json(msg=f"docker ps failed: {err.strip()}")
    ids = out.split()
    if not ids:
        return []
    rc, out, err = module.run_command(["docker", "inspect", "--type", "container", *ids])
    if rc != 0:
        module.fail_json(msg=f"docker inspect failed: {err.strip()}")
    found = []
    for item in json.loads(out):
        st = container_state(item)
        found.append(
            {
                "name": item.get("Name", "").lstrip("/"),
                "state": st["state"],
                "exit_code": st["exit_code"],
            }
        )
    return found


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run_id": {"type": "str", "required": True},
            "run_dir": {"type": "path", "required": True},
            "host": {"type": "str", "required": True},
            "node_rank": {"type": "int", "required": True},
            "nproc_per_node": {"type": "int", "required": True},
            "read_summary": {"type": "bool", "default": False},
            "uid": {"type": "int"},
            "gid": {"type": "int"},
        },
        supports_check_mode=True,
    )
    p = module.params
    found = containers(module, p["run_id"])
    now = time.time()
    result: dict = {"changed": False, "containers": found}
    result["running"] = any(c["state"] in ("running", "restarting") for c in found)
    with as_owner(p["uid"], p["gid"]):
        beats = read_heartbeats(p["run_dir"], global_ranks(p["node_rank"], p["nproc_per_node"]))
        result["heartbeats"] = [
            {
                "rank": rank,
                "step": hb.get("step"),
                "age_sec": round(now - hb["time"], 1)
                if isinstance(hb.get("time"), (int, float))
                else None,
            }
            for rank, hb in sorted(beats.items())
        ]
        exit_path = os.path.join(p["run_dir"], "nodes", f"{p['host']}.exit")
        try:
            with open(exit_path, encoding="utf-8") as fh:
                result["exit"] = fh.read().strip()
        except OSError:
            result["exit"] = ""
        if p["read_summary"]:
            result["summary"] = read_json(os.path.join(p["run_dir"], "summary.json")) or {}
            metrics = read_metrics(os.path.join(p["run_dir"], "metrics.jsonl"))
            result["last_metrics"] = metrics[-1] if metrics else {}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
