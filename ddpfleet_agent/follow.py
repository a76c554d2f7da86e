"""The run's state as the controller shows it, from the records its agents write: train.yml's
follow and status.yml read a run with one read-only command on node rank 0's host
(``read_command``: reader.py), ``snapshot`` picks one attempt's records, ``progress_line`` is
the line printed while following (roles/trainer_run/action_plugins/ddpfleet_run_follow.py).
"""

from __future__ import annotations

import base64
import contextlib
import json
import shlex
from pathlib import Path

from ddpfleet_agent.reader import ENDED
from ddpfleet_agent.records import cause_line
from ddpfleet_agent.report import restarts, shown

MARK = "@@ddpfleet-file@@"
TEXT = ("report.txt",)  # records that are not JSON: parse keeps them as {"text": ...}
# reader.py's lists of names, each {name: [...]}
RECORDS = ("links", "logged", "checkpoints", "present")
READER = (Path(__file__).resolve().parent / "reader.py").read_text()
# A read that answers takes well under a second; one that takes this long (beyond the wait it was
# asked for) has met a shared storage that is gone (a hard NFS mount blocks): timeout(1) ends it
# with exit code 124. status.yml then reads on the other trainers (state.yml).
READ_TIMEOUT = 30


def read_command(run_dir: str, uid: int, gid: int, wait: float = 0.0) -> str:
    """reader.py's command: it prints once progress.json says the run ended or wait s passed."""
    args = [run_dir, str(uid), str(gid), MARK, f"{wait:g}"]
    return f"timeout -k 5 {READ_TIMEOUT + wait:g} " + shlex.join(["python3", "-c", READER, *args])


def read_error(res: dict) -> str:
    """Why a read_command failed: the reader's one line (in stdout where become gives a tty),
    or timeout(1)'s end of a read that hung (a waiting read's reads are a tick apart)."""
    if res.get("rc") in (124, 137):
        return f"no answer within {READ_TIMEOUT} s: is the shared storage gone?"
    said = (res.get("stderr") or res.get("stdout") or "").strip().splitlines()
    return said[-1] if said else f"exit code {res.get('rc')}"


def fallback_report(slurped: list[dict], run_id: str, error: str) -> list[str]:
    """status.yml's report when the run directory cannot be read: each host's own exit record
    (in its host-local fallback directory), slurped (the filter ddpfleet_fallback_report)."""
    lines = [f"run {run_id}: cannot read its run directory ({error}); each host's own record:"]
    for res in slurped:
        host, rec = res.get("item"), None
        with contextlib.suppress(ValueError):  # binascii.Error is one
            rec = json.loads(base64.b64decode(res.get("content") or ""))
        if not isinstance(rec, dict) or not rec:
            lines.append(f"{host}: no exit record (its agent did not end, or the host is gone)")
            continue
        failure = rec.get("failure")
        said = cause_line(run_id, failure) if isinstance(failure, dict) else rec.get("outcome")
        code = f"exit code {rec.get('exit_code')}, attempt {rec.get('attempt')}"
        lines.append(f"{host}: {rec.get('outcome')} ({code}): {rec.get('cause') or said}")
    return lines


def parse(out: str) -> dict[str, dict]:
    """{relative path: JSON object} from read_command's output (TEXT's as {"text": ...})."""
    files = {}
    for chunk in out.split(MARK + " ")[1:]:
        name, _, body = chunk.partition("\n")
        name, data = name.strip(), None
        with contextlib.suppress(ValueError):  # a torn file ({}); TEXT's less reader.py's newline
            data = {"text": body.removesuffix("\n")} if name in TEXT else json.loads(body)
        files[name] = data if isinstance(data, dict) else {}
    return files


def snapshot(files: dict, run_id: str, hosts: list[str], attempt: str) -> dict:
    """The records of one attempt (config.json's when attempt is empty), its progress line and
    outcome (progress.json's status once the run ended, else None). report and plot name no
    attempt: they are the last completed attempt's, after which none starts."""
    config = files.get("config.json", {})
    attempt = attempt or str(config.get("attempt", ""))
    exits = {h: files.get(f"nodes/{h}.exit") or {} for h in hosts}
    progress = files.get("progress.json", {})
    progress = progress if progress.get("attempt", "") == attempt else {}
    found = {name: list(files.get(name, {}).get(name) or []) for name in RECORDS}
    return {
        "attempt": attempt,
        "config": config,
        "summary": files.get("summary.json", {}),
        "exits": {h: e for h, e in exits.items() if e and e.get("attempt", "") == attempt},
        "outcome": progress.get("status") if progress.get("status") in ENDED else None,
        "progress": progress,
        "line": progress_line(run_id, progress, hosts) if progress else "",
        "links": found["links"],
        "logged": found["logged"],  # each agent's log and its size: lines while none leads
        "checkpoints": found["checkpoints"],
        "report": files.get("report.txt", {}).get("text"),
        "plot": "report.png" in found["present"],
    }


def duration(sec: object) -> str:
    """45s, 1m05s, 2h03m; ? when unknown."""
    if not isinstance(sec, (int, float)) or sec < 0:
        return "?"
    s = round(sec)
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_line(run_id: str, p: dict, hosts: list[str]) -> str:
    """run r: step 40/100 (40%), loss 6.1234, 55.2 img/s, ETA 1m05s, hosts running 2/3: node3
    silent (phase train, rebalanced: node3 4 -> 2 (0.31x)): the hosts not running named, and
    the shares of the start that runs."""
    states = p.get("hosts") or {}
    up = [h for h in hosts if states.get(h) == "running"]
    others = ", ".join(f"{h} {states.get(h, 'unknown')}" for h in hosts if h not in up)
    running = f"hosts running {len(up)}/{len(hosts)}{': ' + others if others else ''}"
    if p.get("program") and not p.get("phase"):  # a user's program that writes no heartbeat
        elapsed = duration(p.get("elapsed_sec"))
        return f"run {run_id}: running {elapsed} (no progress reported), {running}"
    step, total = int(p.get("step") or 0), int(p.get("total_steps") or 0)
    where = f"step {step}/{total} ({100 * step // total}%)" if total > 0 else f"step {step}"
    restarts = f", restarts {p['restarts']}" if p.get("restarts") else ""
    last = (p.get("attempts") or [{}])[-1]
    if isinstance(last, dict) and str(last.get("cause")).startswith("rebalanced: "):
        restarts += f", {last['cause']}"  # the shares the ranks run with (regrow.py)
    return (
        f"run {run_id}: {where}, loss {shown(p.get('loss'), '.4f')}, "
        f"{shown(p.get('images_per_sec'), '.1f')} img/s, ETA {duration(p.get('eta_sec'))}, "
        f"{running} (phase {p.get('phase') or '?'}{restarts})"
    )


def restart_lines(run_id: str, p: dict, shown: int) -> list[str]:
    """A line for each start after the first in progress.json's attempts, past ``shown``."""
    lines = []
    for n, a, change in restarts(p.get("attempts"))[shown:]:
        cause = str(a.get("cause"))
        if cause == "rebalanced":
            break  # its new shares (regrow.py) are not known yet: a later poll says them
        shares = cause.startswith("rebalanced")
        where = f"on {len(a.get('hosts') or [])} hosts ({change})" if change else "in place"
        said, after = (cause, "") if shares else (f"restarted {where}", f" after: {cause}")
        lines.append(f"run {run_id}: {said} ({n}) from the newest checkpoint{after}")
    return lines


class Shown:
    """What train.yml's follow printed so far: each poll prints the restarts not shown yet, then
    the progress line when the step or hosts changed (a program without heartbeats: each minute).
    ``restarts``: those an earlier follow of the run said (it read through another host)."""

    def __init__(self, run_id: str, restarts: int = 0) -> None:
        self.run_id, self.restarts, self.last = run_id, restarts, None

    def new_lines(self, snap: dict) -> list[str]:
        p = snap["progress"]
        lines = restart_lines(self.run_id, p, self.restarts)
        self.restarts += len(lines)  # one line a start, once it can be said
        minute = int(p.get("elapsed_sec") or 0) // 60 if p.get("program") else None
        now = (p.get("step"), p.get("hosts"), minute)
        if snap["line"] and now != self.last:
            lines.append(snap["line"])
            self.last = now
        return lines


def container_states(hosts: list[str], looked: list[object]) -> dict[str, str]:
    """{host: the Docker state of its container of the run, '' where it has none, unreachable
    where the controller could not reach the host}: state.yml's docker_container_info results
    (the filter ddpfleet_container_states)."""
    states = {}
    for host, looked_up in zip(hosts, looked, strict=True):
        res = looked_up if isinstance(looked_up, dict) else {}
        state = ((res.get("container") or {}).get("State") or {}).get("Status") or ""
        states[host] = "unreachable" if res.get("unreachable") else state
    return states


def run_status(snap: dict, containers: dict) -> str:
    """running (a container runs), the ended run's status word (progress.json's, else
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
        seen = f"container {state or 'absent'}" if state != "unreachable" else "unreachable"
        lines.append(f"{host}: {seen}{code}")
    lines += [snap["line"]] if snap["line"] else []
    s = snap["summary"]
    if s:
        lines.append(
            f"summary: status {s.get('status', '?')}, steps {s.get('steps', '?')}, "
            f"world size {s.get('world_size', '?')}, img/s {s.get('images_per_sec', '?')}"
        )
    lines += [f"cause: {s['cause']}"] if s.get("cause") else []
    return lines + ([f"where the ranks were: {s['diagnosis']}"] if s.get("diagnosis") else [])
