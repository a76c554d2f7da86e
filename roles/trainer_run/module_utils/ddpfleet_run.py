"""Pure logic shared by the trainer_run modules (no Ansible imports: unit-tested directly).

Everything that decides something about a run lives here: run_id validation, docker
state parsing, heartbeat stall detection, torchrun root-cause parsing, failure-marker
ordering, and the end-of-run report.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
from datetime import datetime

RUN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
TERMINAL_STATUSES = ("completed", "failed", "stopped")
_ROOT_CAUSE_RE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(-?\d+)\s*\(local_rank:\s*(-?\d+)\)"
    r"\s*exitcode\s*:\s*(-?\d+)",
    re.S,
)


def valid_run_id(run_id: object) -> bool:
    """True when run_id is 1-64 letters, digits, '-', '_' or '.' (and not '.' or '..')."""
    return isinstance(run_id, str) and bool(RUN_ID_RE.match(run_id)) and run_id not in (".", "..")


def parse_docker_time(value: str | None) -> float | None:
    """Docker's RFC 3339 timestamps (nanoseconds, 'Z') to epoch seconds; zero time -> None."""
    if not value or value.startswith("0001-01-01"):
        return None
    m = re.match(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$", value)
    if not m:
        return None
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    base = datetime.fromisoformat(m.group(1) + tz)
    frac = float("0" + m.group(2)) if m.group(2) else 0.0
    return base.timestamp() + frac


def container_state(inspect: dict | None) -> dict:
    """Reduce `docker inspect` output for one container to what supervision needs."""
    if not inspect:
        return {"state": "absent", "exit_code": None, "started_at": None, "finished_at": None}
    st = inspect.get("State", {})
    status = st.get("Status", "unknown")
    return {
        "state": status,
        "exit_code": st.get("ExitCode") if status in ("exited", "dead") else None,
        "oom_killed": bool(st.get("OOMKilled")),
        "started_at": parse_docker_time(st.get("StartedAt")),
        "finished_at": parse_docker_time(st.get("FinishedAt")),
    }


def global_ranks(node_rank: int, nproc: int) -> list[int]:
    """Static rendezvous: global rank = node_rank * nproc_per_node + local_rank."""
    return [node_rank * nproc + i for i in range(nproc)]


def stalled_rank(
    ranks: list[int],
    heartbeats: dict[int, dict],
    started_at: float | None,
    now: float,
    timeout: float,
) -> tuple[int, str] | None:
    """Return (rank, reason) for the first of `ranks` whose heartbeat is older than timeout.

    A rank that has not written a heartbeat yet is measured from the container's start,
    so start-up (imports, data loading, rendezvous) counts against the same threshold.
    """
    for rank in ranks:
        hb = heartbeats.get(rank)
        if hb is None or not isinstance(hb.get("time"), (int, float)):
            if started_at is not None and now - started_at > timeout:
                return rank, f"no heartbeat from rank {rank} {now - started_at:.0f}s after start"
            continue
        age = now - float(hb["time"])
        if age > timeout:
            step = hb.get("step")
            return rank, f"heartbeat of rank {rank} stalled at step {step} for {age:.0f}s"
    return None


def parse_root_cause(log_text: str) -> tuple[int, int] | None:
    """(global rank, exit code) of torchrun's "Root Cause" block in a node log, if any."""
    matches = list(_ROOT_CAUSE_RE.finditer(log_text))
    if not matches:
        return None
    m = matches[-1]
    return int(m.group(1)), int(m.group(3))


def describe_exit(exit_code: int | None, oom_killed: bool = False) -> str:
    """One human phrase for a container exit code."""
    if exit_code is None:
        return "container disappeared"
    if oom_killed:
        return f"container was OOM-killed (exit code {exit_code})"
    if exit_code == 137:
        return "container was killed (SIGKILL, exit code 137)"
    if exit_code == 143:
        return "container was terminated (SIGTERM, exit code 143)"
    return f"exited with code {exit_code}"


def root_cause(markers: list[dict]) -> dict | None:
    """The earliest failure marker: by failure time (container finish) then detection time."""
    if not markers:
        return None

    def key(m: dict) -> tuple[float, float, int]:
        failed = m.get("failed_at") or m.get("time") or float("inf")
        return float(failed), float(m.get("time") or float("inf")), int(m.get("rank") or 0)

    return sorted(markers, key=key)[0]


def cause_line(run_id: str, marker: dict) -> str:
    """The one-line failure cause train.yml exits with (the reason names any exit code)."""
    where = f"host {marker.get('host')} rank {marker.get('rank')}"
    return f"run {run_id} failed: {where}: {marker.get('reason')}"


def tail_lines(text: str, count: int) -> list[str]:
    """The last `count` non-empty lines of text."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    return lines[-count:] if count > 0 else []


def read_text(path: str) -> str:
    """A file's text; empty when it is missing or unreadable (logs may not exist yet)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def read_json(path: str) -> dict | None:
    """Parse a JSON file; None when missing or half-written."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_heartbeats(run_dir: str, ranks: list[int]) -> dict[int, dict]:
    """heartbeat/rank-N.json for each rank that has one."""
    out: dict[int, dict] = {}
    for rank in ranks:
        data = read_json(os.path.join(run_dir, "heartbeat", f"rank-{rank}.json"))
        if data is not None:
            out[rank] = data
    return out


def read_markers(run_dir: str) -> list[dict]:
    """Every nodes/<host>.failed marker in the run directory."""
    nodes = os.path.join(run_dir, "nodes")
    markers = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(nodes)):
            if name.endswith(".failed"):
                data = read_json(os.path.join(nodes, name))
                if data is not None:
                    markers.append(data)
    return markers


def read_metrics(path: str) -> list[dict]:
    """metrics.jsonl records (dicts); unparsable lines (a half-written tail) are skipped."""
    records: list[dict] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                with contextlib.suppress(ValueError):
                    rec = json.loads(line)
                    if isinstance(rec, dict):
                        records.append(rec)
    except OSError:
        return []
    return records


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def report_lines(summary: dict, straggler_ratio: float = 0.9) -> list[str]:
    """Table of per-rank img/s (stragglers flagged) plus totals, loss, accuracy, wall time."""
    per_rank = summary.get("per_rank_images_per_sec") or []
    if isinstance(per_rank, dict):
        per_rank = [per_rank[k] for k in sorted(per_rank, key=int)]
    rates = [_num(r) for r in per_rank]
    known = [r for r in rates if r is not None]
    median = statistics.median(known) if known else None
    lines = [f"{'rank':>6}  {'img/s':>10}  note"]
    for rank, rate in enumerate(rates):
        note = ""
        if rate is not None and median and rate < straggler_ratio * median:
            note = f"STRAGGLER ({rate / median:.2f}x median)"
        shown = f"{rate:10.1f}" if rate is not None else f"{'?':>10}"
        lines.append(f"{rank:>6}  {shown}  {note}".rstrip())
    total = _num(summary.get("images_per_sec"))
    loss = _num(summary.get("final_loss"))
    acc = _num(summary.get("final_accuracy"))
    wall = _num(summary.get("wall_time_sec"))
    lines.append(
        f"{'total':>6}  {total:10.1f}" if total is not None else f"{'total':>6}  {'?':>10}"
    )
    lines.append(
        f"status {summary.get('status', '?')}, steps {summary.get('steps', '?')}, "
        f"world size {summary.get('world_size', '?')}, "
        f"final loss {'?' if loss is None else f'{loss:.4f}'}, "
        f"final accuracy {'?' if acc is None else f'{acc:.4f}'}, "
        f"wall time {'?' if wall is None else f'{wall:.1f}s'}"
    )
    return lines


def stragglers(summary: dict, straggler_ratio: float = 0.9) -> list[int]:
    """Ranks whose img/s is below straggler_ratio x the median of all ranks."""
    per_rank = summary.get("per_rank_images_per_sec") or []
    if isinstance(per_rank, dict):
        per_rank = [per_rank[k] for k in sorted(per_rank, key=int)]
    rates = [_num(r) for r in per_rank]
    known = [r for r in rates if r is not None]
    if not known:
        return []
    median = statistics.median(known)
    return [i for i, r in enumerate(rates) if r is not None and r < straggler_ratio * median]


def series(records: list[dict], keys: tuple[str, ...]) -> tuple[list[float], list[float]]:
    """(steps, values) for the first of `keys` present in each metrics record."""
    steps: list[float] = []
    values: list[float] = []
    for rec in records:
        step = _num(rec.get("step"))
        if step is None:
            continue
        for key in keys:
            val = _num(rec.get(key))
            if val is not None:
                steps.append(step)
                values.append(val)
                break
    return steps, values


@contextlib.contextmanager
def as_owner(uid: int | None, gid: int | None):
    """Act as the shared storage's owner (root is squashed on NFS) for the enclosed I/O."""
    if uid is None or os.geteuid() != 0:
        yield
        return
    old_umask = os.umask(0o022)
    os.setegid(gid if gid is not None else uid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.umask(old_umask)


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> bool:
    """Write data via a temp file + rename; False (no write) when the content is unchanged."""
    try:
        with open(path, "rb") as fh:
            if fh.read() == data:
                return False
    except OSError:
        pass
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True
