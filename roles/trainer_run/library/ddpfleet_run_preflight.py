#!/usr/bin/python
"""Check one trainer host before a run starts (changes nothing)."""

from __future__ import annotations

import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ddpfleet_gpuplan import parse_smi, plan
from ansible.module_utils.ddpfleet_ports import bind

DOCUMENTATION = r"""
module: ddpfleet_run_preflight
short_description: Check that a host can take part in a ddpfleet run
description:
- Every peer's hostname resolves to its cluster_ip; the free_ports can be bound; /dev/shm
  (host IPC) or memory (private shm) is big enough; the CPU quota fits the host's CPUs; the
  GPUs (nvidia-smi) are there, as many as asked for (default: every one found), no fewer
  than the processes per host, and of a supported compute capability;
  with /dev/infiniband, the engine grants unlimited memlock. Fails with one line naming the
  host and every problem found. Returns the GPUs to use, the InfiniBand devices and what the
  Docker engine may grant as ulimits.
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
    description: GPUs to use (the inventory's C(gpus)); -1 uses every GPU found, 0 none.
    type: int
    default: -1
  nproc:
    description: Processes per host asked for (train_nproc_per_node; 0 one per GPU, or 1).
    type: int
    default: 0
  min_compute_capability:
    description: Lowest compute capability the training image's CUDA runs on.
    type: str
    default: "7.5"
  cpus:
    description: The run containers' Docker CPU quota (train_cpus); 0 is none.
    type: float
    default: 0.0
  free_ports:
    description: Ports by name that must be free on this host, e.g. {metrics: 29502}.
    type: dict
    default: {}
author: ddpfleet
"""

RETURN = r"""
ulimits:
  description: What the container engine may grant, {memlock, stack} in bytes (-1 unlimited).
  type: dict
  returned: always
gpus:
  description: GPUs the run uses on this host (the inventory's gpus, else every one found).
  type: int
  returned: always
gpu_models:
  description: Model names of the GPUs found.
  type: list
  returned: always
gpu_capabilities:
  description: Compute capability of each GPU found, as "X.Y".
  type: list
  returned: always
infiniband_devices:
  description: Character devices under /dev/infiniband (empty without RDMA hardware).
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


def check_cpus(quota: float, available: int) -> list[str]:
    """train_cpus (a Docker CPU quota; 0: none) must fit the host: dockerd refuses --cpus above
    the CPUs it may use, when the container starts, after the run was launched."""
    if quota > available:
        return [f"train_cpus is {quota:g}, more than the {available} CPUs of this host"]
    return []


def check_gpus(
    module: AnsibleModule, wanted: int, nproc: int, minimum: str
) -> tuple[list[str], int, list[tuple[str, str]]]:
    """(problems, GPUs to use, [(model, capability)]) from nvidia-smi; a host without
    nvidia-smi has no GPUs (and must not be asked for any)."""
    found: list[tuple[str, str]] = []
    smi = module.get_bin_path("nvidia-smi") if wanted != 0 else None
    if smi:
        query = [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"]
        rc, out, err = module.run_command(query)
        if rc != 0:
            return [f"nvidia-smi failed: {(err or out).strip() or rc}"], 0, []
        found = parse_smi(out)
    problems, gpus = plan(found, wanted, nproc, minimum)
    return problems, gpus, found


def infiniband_devices(root: str = "/dev/infiniband") -> list[str]:
    """The RDMA character devices (uverbs*, rdma_cm, umad*, issm*) a container needs."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [os.path.join(root, n) for n in names if not os.path.isdir(os.path.join(root, n))]


def check_rdma(devices: list[str], granted: dict[str, int]) -> list[str]:
    """RDMA pins memory: with InfiniBand/RoCE devices the engine must allow unlimited memlock."""
    if devices and granted.get("memlock", -1) != -1:
        return [
            f"/dev/infiniband is present but the Docker engine caps memlock at "
            f"{granted['memlock']} bytes (RDMA needs unlimited; raise dockerd's LimitMEMLOCK)"
        ]
    return []


def check_ports(ports: dict) -> list[str]:
    """Each port this host cannot bind (a listener holds it: busy)."""
    problems = []
    for name, port in ports.items():
        sock, why = bind(port)
        if sock is None:
            problems.append(f"{name} port {port} {why}")
        else:
            sock.close()
    return problems


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "peers": {"type": "list", "elements": "dict", "required": True},
            "shm_mb": {"type": "int", "required": True},
            "ipc_host": {"type": "bool", "default": False},
            "gpus": {"type": "int", "default": -1},
            "nproc": {"type": "int", "default": 0},
            "min_compute_capability": {"type": "str", "default": "7.5"},
            "cpus": {"type": "float", "default": 0.0},
            "free_ports": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems = check_names(p["peers"]) + check_shm(p["shm_mb"], p["ipc_host"])
    problems += check_cpus(p["cpus"], len(os.sched_getaffinity(0))) + check_ports(p["free_ports"])
    gpu_problems, gpus, found = check_gpus(
        module, p["gpus"], p["nproc"], p["min_compute_capability"]
    )
    granted, ib = engine_ulimits(dockerd_pid()), infiniband_devices()
    problems += gpu_problems + check_rdma(ib, granted)
    if problems:
        module.fail_json(msg=f"preflight failed on {p['host']}: " + "; ".join(problems))
    module.exit_json(
        changed=False,
        gpus=gpus,
        gpu_models=[name for name, _ in found],
        gpu_capabilities=[cap for _, cap in found],
        infiniband_devices=ib,
        ulimits=granted,
    )


if __name__ == "__main__":
    main()
