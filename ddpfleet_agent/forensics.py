"""Forensics: where each of this host's ranks was, and the host's state, within a time bound.

``collect`` dumps every rank's stacks with py-spy, each rank on its own thread with ``timeout``
s (a rank not dumped in time is recorded as such), with each rank's open file descriptors and
the host's state: load, memory, the container's cgroup (CPU throttling, memory), whether the
shared storage answers, nvidia-smi. Each read is bounded: a blocked NFS mount or a hung
nvidia-smi costs the bound, no more. The bundle, in ``runs/<run_id>/forensics/<attempt>/``:
``rank-<N>.txt`` (plain text stacks), ``rank-<N>.json`` (the same for a program) and
``index.json`` (every rank's location, each host's state and the diagnosis, stacks.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ddpfleet_agent.files import call_within, write_json_atomic
from ddpfleet_agent.ranks import parents
from ddpfleet_agent.stacks import diagnose, where

DUMP_TIMEOUT = 5.0  # seconds one rank's dump may take; the teardown waits no longer
NATIVE_NAME = 100  # a native frame's (C++) name is cut to this many characters in the text
THROTTLING = ("nr_periods", "nr_throttled", "throttled_usec", "throttled_time")  # of cpu.stat


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _read(path: str | Path) -> str:
    """A file's text; "" when it cannot be read (a process gone, a host without the file)."""
    with contextlib.suppress(OSError):
        return Path(path).read_bytes().decode(errors="replace")
    return ""


def proc_state(pid: int) -> str:
    """The process state letter (R, S, D, T, Z, ...), "" when it is gone."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[1].split()[0] if ")" in stat else ""


def rank_of(pid: int) -> int | None:
    """The global rank torchrun gave the process (its RANK), None for another process."""
    for item in _read(f"/proc/{pid}/environ").split("\0"):
        if item.startswith("RANK=") and item[5:].isascii() and item[5:].isdigit():
            return int(item[5:])
    return None


def rank_pids() -> list[int]:
    """The rank processes here: those with a RANK whose parent has none (a rank's data-loader
    workers inherit its RANK)."""
    mine = os.getpid()
    parent = parents()
    ranked = {pid for pid in parent if pid != mine and rank_of(pid) is not None}
    return sorted(pid for pid in ranked if parent[pid] not in ranked)


def _fds(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/fd"))
    return None


def stacks(pid: int, timeout: float) -> tuple[list[dict] | None, str | None]:
    """(py-spy's threads, None) or (None, why not) within timeout s: native frames in the
    first 60 % of it (unwinding torch's libraries takes seconds on a loaded host), else Python
    frames only, without pausing the process (all a stopped one gets: py-spy cannot pause it)."""
    exe = py_spy()
    if exe is None:
        return None, "py-spy is not installed where the rank runs"
    deadline = time.monotonic() + timeout
    late = why = f"py-spy did not finish within {timeout:g} s"
    for mode in ([] if proc_state(pid) == "T" else ["--native"]) + ["--nonblocking"]:
        left = (deadline - time.monotonic()) * (0.6 if mode == "--native" else 1)
        if left <= 0:
            break
        try:
            args = [exe, "dump", "--pid", str(pid), "--json", mode]
            proc = subprocess.run(args, capture_output=True, text=True, timeout=left, check=False)
        except subprocess.TimeoutExpired:
            why = late
            continue
        if proc.returncode == 0:
            with contextlib.suppress(ValueError):
                return json.loads(proc.stdout), None
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        why = (lines[0] if lines else f"py-spy exited with {proc.returncode}")[:300]
    return None, why


def _rank(pid: int, timeout: float) -> dict:
    state = proc_state(pid)
    threads, error = stacks(pid, timeout)
    rec = {"rank": rank_of(pid), "pid": pid, "state": state, "fds": _fds(pid),
           "threads": threads, "error": error}  # fmt: skip
    if threads is not None:
        rec["where"] = where(threads, state)
    return rec


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
    mem = _key_values(_read("/proc/meminfo"))
    state = {
        "loadavg": _read("/proc/loadavg").split()[:3],
        "mem_total_kb": mem.get("MemTotal"),
        "mem_available_kb": mem.get("MemAvailable"),
        "cpu_throttling": {k: cpu[k] for k in THROTTLING if k in cpu},
        "container_memory_bytes": _read(cgroup / "memory.current").strip() or None,
        "container_memory_max": _read(cgroup / "memory.max").strip() or None,
    }
    if storage:
        state["storage"] = _stat_within(storage, min(timeout, 2.0))
    return state


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


def collect(pids: list[int], host: str, storage: str = "", timeout: float = DUMP_TIMEOUT) -> dict:
    """Every rank of pids dumped side by side, and the host's state: at most ~timeout s."""
    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(max(len(pids), 1)) as pool:
        ranks = list(pool.map(lambda pid: _rank(pid, timeout), pids))
        state = host_state(storage, timeout)
    return {"host": host, "time": started, "seconds": round(time.time() - started, 2),
            "host_state": state, "nvidia_smi": nvidia_smi(timeout),
            "ranks": [r for r in ranks if r["rank"] is not None]}  # fmt: skip


def compact(collected: dict) -> dict:
    """What the store carries to node rank 0 for the index: no stacks, no nvidia-smi."""
    keep = ("rank", "pid", "state", "fds", "where", "error")
    return {"host": collected["host"], "host_state": collected["host_state"],
            "ranks": [{k: r.get(k) for k in keep} for r in collected["ranks"]]}  # fmt: skip


def render(host: str, rec: dict, state: dict) -> str:
    """One rank's stacks as plain text, py-spy's layout, with the host's state above."""
    lines = [f"rank {rec['rank']} on {host}, pid {rec['pid']}, process state {rec['state']}, "
             f"{rec['fds']} open file descriptors", f"host: {json.dumps(state)}"]  # fmt: skip
    if rec.get("where"):
        lines.append(f"where: {rec['where']['what']} ({rec['where']['at']})")
    if rec.get("error"):
        lines.append(f"no stacks: {rec['error']}")
    for thread in rec.get("threads") or []:
        idle = "active" if thread.get("active") else "idle"
        lines.append(
            f'\nThread {thread.get("os_thread_id")} ({idle}): "{thread.get("thread_name")}"'
        )
        for frame in thread.get("frames") or []:
            name = str(frame.get("name"))
            if not str(frame.get("filename") or "").endswith(".py"):
                name = name[:NATIVE_NAME]
            at, line = frame.get("short_filename"), frame.get("line")
            lines.append(f"    {name} ({at}:{line})" if line else f"    {name} ({at})")
    return "\n".join(lines) + "\n"


def write_ranks(out: Path, collected: dict) -> None:
    """rank-<N>.txt and rank-<N>.json of every rank collected (nvidia-smi-<host>.txt too)."""
    out.mkdir(parents=True, exist_ok=True)
    host, state = collected["host"], collected["host_state"]
    for rec in collected["ranks"]:
        name = f"rank-{rec['rank']}"
        (out / f"{name}.txt").write_text(render(host, rec, state))
        write_json_atomic(out / f"{name}.json", {"host": host, "host_state": state, **rec})
    if collected.get("nvidia_smi"):
        (out / f"nvidia-smi-{host}.txt").write_text(collected["nvidia_smi"])


def _flat(hosts: list[dict]) -> list[dict]:
    return sorted(({**r, "host": h["host"], "file": f"rank-{r['rank']}.txt"}
                   for h in hosts for r in h["ranks"]), key=lambda r: r["rank"])  # fmt: skip


def diagnose_line(hosts: list[dict], missing: dict[str, list[int]]) -> str:
    """The diagnosis from every host's compact record (``missing``: host -> its ranks)."""
    return diagnose(_flat(hosts), missing)


def write_index(out: Path, head: dict, hosts: list[dict], missing: dict[str, list[int]]) -> str:
    """index.json from every host's compact record; returns the diagnosis line it holds."""
    ranks = _flat(hosts)
    line = diagnose(ranks, missing)
    index = {**head, "time": time.time(), "diagnosis": line, "ranks": ranks,
             "hosts": {h["host"]: h["host_state"] for h in hosts},
             "missing": {host: {"ranks": r, "why": "its agent did not answer"}
                         for host, r in missing.items()}}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "index.json", index)
    return line
