"""ddpfleet_run_follow: follow a run through the records its agents write (read-only).

Each poll is one read of config.json, summary.json, progress.json and nodes/*.exit over the
task's connection (python3 -c, as the storage owner with no supplementary groups, never
following a link): no module shipped, nothing written, so stopping the controller never
touches the run. The run has ended once progress.json's status says so (completed, stopped or
failed: node rank 0's agent writes it, after summary.json and report.txt). once: a single
read, with the run's status word and status.yml's lines (containers: {host: docker state or
''}). Returns outcome, summary, exits, progress, config, attempt and lines (the progress lines
shown).
"""

from __future__ import annotations

import json
import shlex
import time

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()
MARK = "@@ddpfleet-file@@"
ENDED = ("completed", "failed", "stopped")
SPEC = {
    "run_dir": {"type": "str", "required": True},
    "run_id": {"type": "str", "required": True},
    "hosts": {"type": "list", "elements": "str", "required": True},
    "attempt": {"type": "str", "default": ""},  # default: config.json's
    "poll_interval": {"type": "float", "default": 5.0},
    "stale_after": {"type": "float", "default": 90.0},
    "once": {"type": "bool", "default": False},
    "containers": {"type": "dict", "default": {}},
    "owner_uid": {"type": "int", "required": True},
    "owner_gid": {"type": "int", "required": True},
}


# Run by the node's python3 as root, over the task's connection: drop to the storage owner's
# uid and gid with no supplementary groups (what the ranks themselves may read), then read the
# records without following a link (a container may plant one: nodes/x.exit -> /etc/shadow),
# regular files only, at most 1 MiB each.
READER = r"""
import os, stat, sys
run_dir, uid, gid, mark = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if os.getuid() != 0:
    sys.exit("needs root on the node to act as the storage's owner: log in as root, or as a "
             "sudo user with ansible_become: true")
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
out = sys.stdout.buffer
def opendir(name, parent=None):
    try:
        return os.open(name, NOFOLLOW | os.O_DIRECTORY, dir_fd=parent)
    except OSError:
        return None
def emit(shown, parent, name):
    try:
        fd = os.open(name, NOFOLLOW, dir_fd=parent)
    except OSError:
        return
    with os.fdopen(fd, "rb") as fh:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            out.write(("%s %s\n" % (mark, shown)).encode() + fh.read(1 << 20) + b"\n")
top = opendir(run_dir)
if top is not None:
    for name in ("config.json", "summary.json", "progress.json"):
        emit(name, top, name)
    nodes = opendir("nodes", top)
    for name in sorted(os.listdir(nodes)) if nodes is not None else []:
        if name.endswith(".exit"):
            emit("nodes/" + name, nodes, name)
"""


def read_command(run_dir: str, uid: int, gid: int) -> str:
    """One read-only command: each record that exists, behind a marker line."""
    args = [run_dir, str(uid), str(gid), MARK]
    return f"python3 -c {shlex.quote(READER)} " + " ".join(shlex.quote(a) for a in args)


def parse(out: str) -> dict[str, dict]:
    """{relative path: JSON object} from read_command's output ({} for a torn file)."""
    files = {}
    for chunk in out.split(MARK + " ")[1:]:
        name, _, body = chunk.partition("\n")
        try:
            data = json.loads(body)
        except ValueError:
            data = {}
        files[name.strip()] = data if isinstance(data, dict) else {}
    return files


def snapshot(files: dict, run_id: str, hosts: list[str], attempt: str) -> dict:
    """The records of one attempt (config.json's when attempt is empty), its progress line and
    its outcome: progress.json's status once it says the run ended, else None."""
    config, summary = files.get("config.json", {}), files.get("summary.json", {})
    attempt = attempt or str(config.get("attempt", ""))
    exits = {h: files.get(f"nodes/{h}.exit") or {} for h in hosts}
    exits = {h: e for h, e in exits.items() if e and e.get("attempt", "") == attempt}
    progress = files.get("progress.json", {})
    progress = progress if progress.get("attempt", "") == attempt else {}
    return {
        "attempt": attempt,
        "config": config,
        "summary": summary,
        "exits": exits,
        "outcome": progress.get("status") if progress.get("status") in ENDED else None,
        "progress": progress,
        "line": progress_line(run_id, progress, hosts) if progress else "",
    }


def duration(sec: object) -> str:
    """45s, 1m05s, 2h03m; ? when unknown."""
    if not isinstance(sec, (int, float)) or sec < 0:
        return "?"
    s = round(sec)
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def _num(value: object, fmt: str) -> str:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return format(value, fmt) if ok else "?"


def progress_line(run_id: str, p: dict, hosts: list[str]) -> str:
    """run r: step 40/100 (40%), loss 6.1234, 55.2 img/s, ETA 1m05s, hosts running 3/3
    (phase train); hosts not running are named (hosts running 2/3: node3 silent)."""
    step, total = int(p.get("step") or 0), int(p.get("total_steps") or 0)
    where = f"step {step}/{total} ({100 * step // total}%)" if total > 0 else f"step {step}"
    states = p.get("hosts") or {}
    up = [h for h in hosts if states.get(h) == "running"]
    others = ", ".join(f"{h} {states.get(h, 'unknown')}" for h in hosts if h not in up)
    if p.get("program") and not p.get("phase"):  # a user's program that writes no heartbeat
        return (
            f"run {run_id}: running {duration(p.get('elapsed_sec'))} (no progress reported), "
            f"hosts running {len(up)}/{len(hosts)}{': ' + others if others else ''}"
        )
    return (
        f"run {run_id}: {where}, loss {_num(p.get('loss'), '.4f')}, "
        f"{_num(p.get('images_per_sec'), '.1f')} img/s, ETA {duration(p.get('eta_sec'))}, "
        f"hosts running {len(up)}/{len(hosts)}{': ' + others if others else ''}"
        f" (phase {p.get('phase') or '?'})"
    )


def run_status(snap: dict, containers: dict) -> str:
    """running (a container runs), progress.json's status word once the run ended (else
    summary.json's), unknown (launched, nothing recorded since) or absent (never launched)."""
    if "running" in containers.values():
        return "running"
    status = snap["outcome"] or snap["summary"].get("status")
    return status if status in ENDED else ("unknown" if snap["config"] else "absent")


def status_lines(run_id: str, status: str, snap: dict, containers: dict) -> list[str]:
    """status.yml's report: the run, each host's container and agent exit, progress, summary."""
    lines = [f"run {run_id}: {status}"]
    for host, state in containers.items():
        e = snap["exits"].get(host)
        code = f"; agent exit code {e.get('exit_code')} ({e.get('outcome')})" if e else ""
        lines.append(f"{host}: container {state or 'absent'}{code}")
    lines += [snap["line"]] if snap["line"] else []
    s = snap["summary"]
    if s:
        lines.append(
            f"summary: status {s.get('status', '?')}, steps {s.get('steps', '?')}, "
            f"world size {s.get('world_size', '?')}, img/s {s.get('images_per_sec', '?')}"
        )
    return lines + ([f"cause: {s['cause']}"] if s.get("cause") else [])


class ActionModule(ActionBase):
    """Poll the run directory until progress.json says the run ended, or the agents fall
    silent."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def _read(self, a: dict) -> tuple[dict | None, str]:
        cmd = read_command(a["run_dir"], a["owner_uid"], a["owner_gid"])
        try:
            res = self._low_level_execute_command(cmd, sudoable=True)
        except AnsibleConnectionFailure as exc:
            return None, str(exc)
        if res.get("rc") != 0:
            return None, (res.get("stderr") or f"exit code {res.get('rc')}").strip()
        return parse(res.get("stdout", "")), ""

    def run(self, tmp: object = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        _, a = self.validate_argument_spec(argument_spec=SPEC)
        run_id, hosts, lines = a["run_id"], a["hosts"], []
        snap, shown, seen, error = None, None, None, ""
        last_change = time.monotonic()
        while a["once"] or time.monotonic() - last_change <= a["stale_after"]:
            files, error = self._read(a)
            now = time.monotonic()
            if files is None and a["once"]:
                break
            if files is not None:
                snap = snapshot(files, run_id, hosts, a["attempt"])
                if a["once"]:
                    status = run_status(snap, a["containers"])
                    result["status_lines"] = status_lines(run_id, status, snap, a["containers"])
                    return self._done(result, snap, status, [snap["line"]] * bool(snap["line"]))
                p = snap["progress"]
                # a program without heartbeats has no steps: say it runs once a minute
                minute = int(p.get("elapsed_sec") or 0) // 60 if p.get("program") else None
                if snap["line"] and (p.get("step"), p.get("hosts"), minute) != shown:
                    display.display(snap["line"])
                    lines.append(snap["line"])
                    shown = (p.get("step"), p.get("hosts"), minute)
                if (p, sorted(snap["exits"])) != seen:
                    seen, last_change = (p, sorted(snap["exits"])), now
                if snap["outcome"]:
                    return self._done(result, snap, snap["outcome"], lines)
            time.sleep(a["poll_interval"])
        silent = round(time.monotonic() - last_change)
        if snap is None or error:
            return {**result, "failed": True, "msg": f"cannot read {a['run_dir']}: {error}"}
        missing = ", ".join(h for h in hosts if h not in snap["exits"])
        result["msg"] = (
            f"run {run_id}: agents stopped reporting (progress.json unchanged for {silent} s, "
            f"no exit record from {missing}); see status.yml -e run_id={run_id}"
        )
        return self._done(result, snap, "lost", lines)

    @staticmethod
    def _done(result: dict, snap: dict, outcome: str, lines: list[str]) -> dict:
        keep = ("summary", "exits", "progress", "config", "attempt")
        result.update({k: snap[k] for k in keep}, changed=False, outcome=outcome, lines=lines)
        return result
