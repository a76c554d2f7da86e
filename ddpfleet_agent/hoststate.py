"""A host's state for the forensics bundle: load, memory, the run container's cgroup (CPU
throttling, memory), whether the shared storage answers, and nvidia-smi where there is one.
Each read is bounded: a blocked NFS mount or a hung nvidia-smi costs the bound, no more."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from ddpfleet_agent.files import call_within

THROTTLING = ("nr_periods", "nr_throttled", "throttled_usec", "throttled_time")  # of cpu.stat


def _stat_within(path: str, timeout: float) -> dict:
    """Whether a stat of path answers within timeout s (an NFS server gone blocks it)."""
    started = time.monotonic()

    def call() -> str | None:
        try:
            os.stat(path)
        except OSError as exc:
            return exc.strerror
        return None

    box = call_within(call, timeout)
    return {"path": path, "answered": bool(box), "error": box[0] if box else None,
            "seconds": round(time.monotonic() - started, 3)}  # fmt: skip


def _key_values(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def host_state(storage: str, timeout: float) -> dict:
    """Load, memory, the container's CPU throttling and memory, and the shared storage."""
    cgroup = Path("/sys/fs/cgroup")
    cpu = _key_values(_read(cgroup / "cpu.stat") or _read(cgroup / "cpu" / "cpu.stat"))
    mem = _key_values(_read(Path("/proc/meminfo")))
    state = {
        "loadavg": _read(Path("/proc/loadavg")).split()[:3],
        "mem_total_kb": mem.get("MemTotal"),
        "mem_available_kb": mem.get("MemAvailable"),
        "cpu_throttling": {k: cpu[k] for k in THROTTLING if k in cpu},
        "container_memory_bytes": _read(cgroup / "memory.current").strip() or None,
        "container_memory_max": _read(cgroup / "memory.max").strip() or None,
    }
    if storage:
        state["storage"] = _stat_within(storage, min(timeout, 2.0))
    return state


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text()
    return ""


def nvidia_smi(timeout: float) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=timeout,
                              check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"nvidia-smi -q did not finish within {timeout:g} s"
    return proc.stdout or proc.stderr
