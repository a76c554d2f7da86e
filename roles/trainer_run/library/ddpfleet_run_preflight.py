#!/usr/bin/python
"""Check one trainer host before a run starts (changes nothing)."""

from __future__ import annotations

import os
import socket

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ddpfleet_run_preflight
short_description: Check that a host can take part in a ddpfleet run
description:
- Every peer's hostname resolves to its cluster_ip; /dev/shm (host IPC) or memory (private
  shm) is big enough; enough GPUs are visible. Fails with one line naming the host and every
  problem found. Returns what the Docker engine may grant as ulimits.
options:
  host:
    description: inventory_hostname.
    type: str
    required: true
  peers:
    description: Each trainer as {name, hostname, cluster_ip}.
    type: list
    elements: dict
    required: true
  shm_mb:
    description: Minimum /dev/shm the ranks need, in MiB.
    type: int
    required: true
  ipc_host:
    description: Ranks use the host's /dev/shm (else a private shm of shm_mb).
    type: bool
    default: false
  gpus:
    description: GPUs this host must offer.
    type: int
    default: 0
author: ddpfleet
"""

RETURN = r"""
ulimits:
  description: What the container engine may grant, {memlock, stack} in bytes (-1 unlimited).
  type: dict
  returned: always
gpu_models:
  description: Model names of the GPUs found.
  type: list
  returned: always
"""


def mem_total_mb() -> int:
    with open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


CAP_SYS_RESOURCE = 24
LIMIT_ROWS = {"memlock": "Max locked memory", "stack": "Max stack size"}


def dockerd_pid() -> int | None:
    """PID of the Docker engine (dockerd) on this host."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm", encoding="ascii") as fh:
                    if fh.read().strip() == "dockerd":
                        return int(entry)
            except OSError:
                continue
    return None


def engine_ulimits(pid: int | None) -> dict[str, int]:
    """Hard limits a container can get: unlimited (-1) when dockerd holds CAP_SYS_RESOURCE,
    else dockerd's own hard limits (an engine nested in a container cannot raise them)."""
    if pid is None:
        return {"memlock": -1, "stack": -1}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            caps = next(int(ln.split()[1], 16) for ln in fh if ln.startswith("CapEff:"))
        with open(f"/proc/{pid}/limits", encoding="ascii") as fh:
            rows = fh.read().splitlines()
    except (OSError, StopIteration, ValueError):
        return {"memlock": -1, "stack": -1}
    if caps & (1 << CAP_SYS_RESOURCE):
        return {"memlock": -1, "stack": -1}
    limits = {}
    for key, label in LIMIT_ROWS.items():
        row = next((r for r in rows if r.startswith(label)), "")
        hard = row[len(label) :].split()[1] if row else "unlimited"
        limits[key] = -1 if hard == "unlimited" else int(hard)
    return limits


def check_names(peers: list[dict]) -> list[str]:
    """Each peer's hostname must resolve to its cluster_ip."""
    problems = []
    for peer in peers:
        name = str(peer.get("hostname") or peer.get("name"))
        want = str(peer.get("cluster_ip"))
        try:
            got = socket.gethostbyname(name)
        except OSError:
            problems.append(f"{name} does not resolve (want {want})")
            continue
        if got != want:
            problems.append(f"{name} resolves to {got}, not its cluster_ip {want}")
    return problems


def check_shm(shm_mb: int, ipc_host: bool) -> list[str]:
    """The ranks' /dev/shm: the host's (ipc_host) or a private one that memory must hold."""
    if ipc_host:
        st = os.statvfs("/dev/shm")
        have = st.f_frsize * st.f_blocks // (1024 * 1024)
        if have < shm_mb:
            return [f"/dev/shm is {have} MiB, need {shm_mb} MiB"]
    elif mem_total_mb() < shm_mb:
        return [f"memory {mem_total_mb()} MiB is less than shm size {shm_mb} MiB"]
    return []


def check_gpus(module: AnsibleModule, gpus: int) -> tuple[list[str], list[str]]:
    """(problems, models): nvidia-smi must list at least `gpus` GPUs."""
    if gpus <= 0:
        return [], []
    rc, out, err = module.run_command(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    if rc != 0:
        return [f"nvidia-smi failed: {err.strip() or 'not found'}"], []
    models = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if len(models) < gpus:
        return [f"{len(models)} GPUs visible, inventory says gpus={gpus}"], models
    return [], models


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "peers": {"type": "list", "elements": "dict", "required": True},
            "shm_mb": {"type": "int", "required": True},
            "ipc_host": {"type": "bool", "default": False},
            "gpus": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems = check_names(p["peers"]) + check_shm(p["shm_mb"], p["ipc_host"])
    gpu_problems, models = check_gpus(module, p["gpus"])
    problems += gpu_problems
    if problems:
        module.fail_json(msg=f"preflight failed on {p['host']}: " + "; ".join(problems))
    module.exit_json(changed=False, gpu_models=models, ulimits=engine_ulimits(dockerd_pid()))


if __name__ == "__main__":
    main()
