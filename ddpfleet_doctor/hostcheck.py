"""Whether a host can take part in a run, apart from its GPUs (``gpuplan``): names, ports,
/dev/shm, the CPU quota, and what the Docker engine may grant for RDMA.

Standard library only: train.yml's preflight and port-probe modules (roles/trainer_run/library)
import this file through their module_utils link, on hosts without the packages. Each check
returns the problems it found as lines, empty when there are none.
"""

from __future__ import annotations

import errno
import os
import socket

CAP_SYS_RESOURCE = 24
LIMIT_ROWS = {"memlock": "Max locked memory", "stack": "Max stack size"}
UNLIMITED = {"memlock": -1, "stack": -1}


def bind(port: int) -> tuple[socket.socket | None, str]:
    """A TCP socket bound to 0.0.0.0:port (SO_REUSEADDR: a port in TIME_WAIT is free), or
    None and why not: 'is busy' when a listener holds the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", int(port)))
    except OSError as exc:
        sock.close()
        return None, "is busy" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
    return sock, ""


def check_ports(ports: dict) -> list[str]:
    """Each port by name this host cannot bind (a listener holds it: busy)."""
    problems = []
    for name, port in ports.items():
        sock, why = bind(port)
        if sock is None:
            problems.append(f"{name} port {port} {why}")
        else:
            sock.close()
    return problems


def check_names(peers: list[dict]) -> list[str]:
    """Each peer ({name, hostname, cluster_ip}) must resolve to its cluster_ip."""
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


def mem_total_mb() -> int:
    with open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


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
    """train_cpus (a CPU quota; 0: none) must fit the host: a quota above the CPUs it may use
    limits nothing (dockerd takes it as a CFS period and quota), a mistake (a typo, another
    host's figure) that would go unseen; dockerd refused it as --cpus only when the container
    started, after the run was launched."""
    if quota > available:
        return [f"train_cpus is {quota:g}, more than the {available} CPUs of this host"]
    return []


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
        return dict(UNLIMITED)
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            caps = next(int(ln.split()[1], 16) for ln in fh if ln.startswith("CapEff:"))
        with open(f"/proc/{pid}/limits", encoding="ascii") as fh:
            rows = fh.read().splitlines()
    except (OSError, StopIteration, ValueError):
        return dict(UNLIMITED)
    if caps & (1 << CAP_SYS_RESOURCE):
        return dict(UNLIMITED)
    limits = {}
    for key, label in LIMIT_ROWS.items():
        row = next((r for r in rows if r.startswith(label)), "")
        hard = row[len(label) :].split()[1] if row else "unlimited"
        limits[key] = -1 if hard == "unlimited" else int(hard)
    return limits


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
