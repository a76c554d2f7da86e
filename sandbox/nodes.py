"""Creating, booting and reaching the node containers."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from sandbox.dockercli import LABEL, SandboxError, docker, inspect, last_line, run
from sandbox.settings import (
    IMAGES_MOUNT,
    NETWORK,
    NFS_EXPORT_DIR,
    SHARED_MOUNT,
    SHARED_VOLUME,
    WHEELHOUSE_MOUNT,
    Node,
    Settings,
)

BOOT_TIMEOUT = 120.0
"""Seconds a node may take to reach systemd running/degraded (env SANDBOX_BOOT_TIMEOUT)."""
SSH_OPTIONS = [
    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
]  # fmt: skip


def storage_mode() -> str:
    """``nfs`` when the host kernel can mount NFS (containers share it), else ``shared_volume``."""
    text = Path("/proc/filesystems").read_text()
    return (
        "nfs"
        if any(line.split()[-1:] in (["nfs"], ["nfs4"]) for line in text.splitlines())
        else "shared_volume"
    )


def _cgroup_args() -> list[str]:
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():  # unified hierarchy (cgroup v2)
        return ["--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw"]
    return ["-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro"]


def run_args(settings: Settings, node: Node, image: str, mode: str) -> list[str]:
    """The ``docker run`` arguments of one node (no --privileged: it fails on some VMs)."""
    args = [
        "run", "--detach", "--name", node.container, "--hostname", node.container,
        "--network", NETWORK, "--ip", node.ip,
        "--label", f"{LABEL}=1", "--label", f"{LABEL}.node={node.name}",
        "--stop-signal", "SIGRTMIN+3",  # systemd's clean shutdown (import can't set it)
        # SYS_TIME dropped: a time daemon in a node would otherwise set the host's clock.
        "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE", "--cap-drop", "SYS_TIME",
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--tmpfs", "/run", "--tmpfs", "/run/lock", *_cgroup_args(),
        "--volume", f"{node.docker_volume}:/var/lib/docker",
    ]  # fmt: skip
    first = node.index == 1
    if first:  # NFS server and registry
        args += ["--volume", f"{SHARED_VOLUME}:{NFS_EXPORT_DIR}"]
        args += ["--volume", f"{settings.cache / 'images'}:{IMAGES_MOUNT}:ro"]
        args += ["--volume", f"{settings.wheelhouse}:{WHEELHOUSE_MOUNT}:ro"]
    if mode == "shared_volume":
        args += ["--volume", f"{SHARED_VOLUME}:{SHARED_MOUNT}"]
    return [*args, image]


def ensure_running(settings: Settings, node: Node, image: str, mode: str) -> str:
    """Create or start the node's container; return what was done."""
    info = inspect("container", node.container)
    if info is None:
        docker(*run_args(settings, node, image, mode))
        return "created"
    if (info["Config"].get("Labels") or {}).get(LABEL) != "1":
        raise SandboxError(
            f"a container named {node.container} exists but was not made by the sandbox"
        )
    if info["Config"].get("Image") != image:
        print(
            f"sandbox: note: {node.name} runs an older node image ({info['Config'].get('Image')}); "
            "'python -m sandbox down' and 'up' to use the current recipe"
        )
    if not info["State"]["Running"]:
        docker("start", node.container)
        return "started"
    return "running"


def _state(node: Node) -> str:
    proc = run(
        ["docker", "exec", node.container, "systemctl", "is-system-running"],
        check=False,
        timeout=30,
    )
    return proc.stdout.strip() or last_line(proc.stderr)


def journal_tail(node: Node, lines: int = 15) -> str:
    proc = run(
        ["docker", "exec", node.container, "journalctl", "--no-pager", "-q", "-n", str(lines)],
        check=False,
        timeout=30,
    )
    if proc.returncode != 0:  # systemd never came up: show the container's own output
        proc = run(["docker", "logs", "--tail", str(lines), node.container], check=False)
        return (proc.stdout + proc.stderr).rstrip()
    return proc.stdout.rstrip()


def boot_timeout() -> float:
    raw = os.environ.get("SANDBOX_BOOT_TIMEOUT", str(BOOT_TIMEOUT))
    try:
        return float(raw)
    except ValueError:
        raise SandboxError(f"SANDBOX_BOOT_TIMEOUT={raw!r} is not a number of seconds") from None


def wait_booted(nodes: list[Node], timeout: float) -> dict[str, float]:
    """Wait until systemd on every node is running (or degraded); return boot seconds."""
    started = time.monotonic()
    pending, booted = list(nodes), {}
    while pending:
        for node in list(pending):
            state = _state(node)
            if state in ("running", "degraded"):
                booted[node.name] = time.monotonic() - started
                pending.remove(node)
                if state == "degraded":
                    failed = docker(
                        "exec", node.container, "systemctl", "--failed", "--plain", "--no-legend"
                    )
                    units = [line.split()[0] for line in failed.splitlines() if line.split()]
                    print(f"sandbox: warning: {node.name} booted degraded: {', '.join(units)}")
            elif time.monotonic() - started > timeout or not _is_running(node):
                raise SandboxError(
                    f"node {node.name} ({node.container}) failed to boot within {timeout:.0f}s "
                    f"(systemd state: {state}; inspect it with 'docker exec -it {node.container} "
                    "bash', remove it with 'python -m sandbox down'); last journal lines:\n"
                    f"{journal_tail(node)}"
                )
        if pending:
            time.sleep(0.5)
    return booted


def _is_running(node: Node) -> bool:
    info = inspect("container", node.container)
    return bool(info and info["State"]["Running"])


def mask_kernel_less_units(node: Node) -> None:
    """Mask units the host kernel cannot serve in any container (a sandbox artefact).

    Without sunrpc in the host kernel, rpc_pipefs cannot be mounted, and nfs-common's
    ``run-rpc_pipefs.mount`` (pulled in by the NFS roles) would fail and leave systemd
    degraded; real servers have sunrpc. Masking works before the unit is installed.
    """
    if "rpc_pipefs" in Path("/proc/filesystems").read_text():
        return
    script = (
        "systemctl mask --quiet run-rpc_pipefs.mount && "
        "systemctl reset-failed run-rpc_pipefs.mount 2>/dev/null; true"
    )
    run(["docker", "exec", node.container, "sh", "-c", script], timeout=60)


def authorize_key(node: Node, public_key: str, login: str) -> None:
    """Let the sandbox key log in as root and as ``login``: a user with passwordless sudo,
    made here the way a cloud image's first boot makes one (real clusters log in so)."""
    user = "" if login == "root" else (
        f"id -u {login} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {login}; "
        f"echo '{login} ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/90-{login}.tmp && "
        f"chmod 0440 /etc/sudoers.d/90-{login}.tmp && visudo -cqf /etc/sudoers.d/90-{login}.tmp && "
        f"mv /etc/sudoers.d/90-{login}.tmp /etc/sudoers.d/90-{login} && "
        f"install -d -m 0700 -o {login} -g {login} ~{login}/.ssh && "
        f"install -m 0600 -o {login} -g {login} /root/.ssh/authorized_keys ~{login}/.ssh/; "
    )  # fmt: skip
    script = (
        "set -e; install -d -m 0700 /root/.ssh && umask 077 && "
        "cat > /root/.ssh/authorized_keys && chmod 0600 /root/.ssh/authorized_keys; " + user
    )
    run(
        ["docker", "exec", "-i", node.container, "sh", "-c", script],
        input_data=public_key.encode(),
        timeout=30,
    )


def ssh(
    settings: Settings, node: Node, command: str, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on ``node`` over SSH with the sandbox key, as Ansible would."""
    target = f"{settings.login}@{node.ip}"
    args = ["ssh", "-i", str(settings.key_path), *SSH_OPTIONS, target, command]
    return run(args, check=False, timeout=timeout)


def wait_ssh(settings: Settings, node: Node, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        proc = ssh(settings, node, "hostname")
        if proc.returncode == 0 and proc.stdout.strip() == node.container:
            return
        if time.monotonic() > deadline:
            raise SandboxError(
                f"node {node.name} booted but SSH to {settings.login}@{node.ip} fails: "
                f"{last_line(proc.stderr + proc.stdout)}"
            )
        time.sleep(1)
