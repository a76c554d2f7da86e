"""ddpfleet_run_follow: follow a run through the records its agents write (read-only).

Each poll is one read of config.json, summary.json, progress.json, report.txt and nodes/*.exit
over the task's connection (python3 -c, as the storage owner with no supplementary groups, never
following a link): no module shipped, nothing written, so stopping the controller never
touches the run. The run has ended once progress.json's status says so (completed, stopped or
failed: node rank 0's agent writes it, after summary.json and report.txt); a poll's read waits
on the node for it, so the end is seen within a quarter second. once: a single read, with the
run's status word and status.yml's lines (containers: {host: docker state or ''}). Returns
outcome, summary, exits, progress, config, attempt, links (the links planted among ddpfleet's
own files: ddpfleet_agent/reader.py), report and plot (report.txt's text, report.png there),
lines (the progress lines shown) and shown (the restarts said so far).

move_on: another trainer reads the same run directory (the shared storage), so the first read
that fails, or that has not answered ANSWER s after its wait (a host gone dark holds its SSH
connection until the keepalives give up, 45 s), ends this follow with ``unread`` and why (not
failed): follow.yml goes on through the next trainer, as when node rank 0's host is lost, and
passes ``shown`` on so that no restart is said twice. The last trainer's reads retry until the
agents have been silent for stale_after: progress.json, the exit records and the agents'
logs (nodes/*.log) unchanged.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
from pathlib import Path

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The run's records and lines are read by ddpfleet_agent.follow (this checkout's copy, first on
# the path: a controller venv may hold another "trainer").
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from ddpfleet_agent import follow as view

display = Display()
# A poll's read waits for the end at most this long: its timeout(1) is READ_TIMEOUT plus the
# wait, so a longer one only delays noticing a hung storage or a lost link, and a silent SSH
# command of 90 s at most stays far inside what keepalives (ansible.cfg) hold open.
MAX_WAIT = 30.0
# A read through a host that answers ends within its wait and a second or two (an SSH login and
# sudo included); where another trainer can read, one still silent this long after its wait is
# given up on (its command is left to SSH's keepalives) and the follow hands over.
ANSWER = 15.0
SPEC = {
    "run_dir": {"type": "str", "required": True},
    "run_id": {"type": "str", "required": True},
    "hosts": {"type": "list", "elements": "str", "required": True},
    "attempt": {"type": "str", "default": ""},  # default: config.json's
    "poll_interval": {"type": "float", "default": 5.0},
    "stale_after": {"type": "float", "default": 90.0},
    "once": {"type": "bool", "default": False},
    "containers": {"type": "dict", "default": {}},
    "move_on": {"type": "bool", "default": False},
    "shown": {"type": "int", "default": 0},
    "owner_uid": {"type": "int", "required": True},
    "owner_gid": {"type": "int", "required": True},
}


class ActionModule(ActionBase):
    """Poll the run directory until progress.json says the run ended, or the agents fall
    silent."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def _read(self, a: dict, wait: float) -> tuple[dict | None, str]:
        if not a["move_on"]:
            return self._read_now(a, wait)
        answer: list = []  # the read's result, or what it raised

        def read() -> None:
            try:
                answer.append(self._read_now(a, wait))
            except Exception as exc:  # raised again in the task's thread
                answer.append(exc)

        # a daemon thread, in the task's context (Ansible keeps its task there): one still
        # blocked on a dark host does not hold the worker's exit
        here = contextvars.copy_context()
        reader = threading.Thread(target=here.run, args=(read,), daemon=True)
        reader.start()
        reader.join(wait + ANSWER)
        if not answer:
            return None, f"no answer within {wait + ANSWER:g} s"
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    def _read_now(self, a: dict, wait: float) -> tuple[dict | None, str]:
        cmd = view.read_command(a["run_dir"], a["owner_uid"], a["owner_gid"], wait)
        try:
            res = self._low_level_execute_command(cmd, sudoable=True)
        except AnsibleConnectionFailure as exc:
            return None, str(exc)
        if res.get("rc") != 0:
            return None, view.read_error(res)
        return view.parse(res.get("stdout", "")), ""

    def run(self, tmp: object = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        _, a = self.validate_argument_spec(argument_spec=SPEC)
        run_id, hosts, lines = a["run_id"], a["hosts"], []
        snap, shown, seen, error = None, view.Shown(run_id, a["shown"]), None, ""
        wait = 0.0 if a["once"] else min(a["poll_interval"], MAX_WAIT)
        last_change = time.monotonic()
        while a["once"] or time.monotonic() - last_change <= a["stale_after"]:
            started = time.monotonic()
            files, error = self._read(a, wait)
            now = time.monotonic()
            if files is None and a["once"]:
                break
            if files is None and a["move_on"]:
                here = self._task.delegate_to or (task_vars or {}).get("inventory_hostname")
                display.display(f"run {run_id}: its records cannot be read through {here} "
                                f"({error}); reading them through the next trainer")  # fmt: skip
                return {**result, "unread": True, "msg": error, "lines": lines,
                        "shown": shown.restarts}  # fmt: skip
            if files is not None:
                snap = view.snapshot(files, run_id, hosts, a["attempt"])
                if a["once"]:
                    on = a["containers"]
                    status = view.run_status(snap, on)
                    result["status_lines"] = view.status_lines(run_id, status, snap, on)
                    return self._done(result, snap, status, [snap["line"]] * bool(snap["line"]))
                for line in shown.new_lines(snap):
                    display.display(line)
                    lines.append(line)
                # an agent's log line counts: two hosts lost at once, the others wait for
                # each in turn before one leads and writes progress.json again (failover.py)
                if (now_seen := (snap["progress"], sorted(snap["exits"]), snap["logged"])) != seen:
                    seen, last_change = now_seen, now
                if snap["outcome"]:
                    return self._done(result, snap, snap["outcome"], lines)
            # one read per interval: one that waited spent part of it; a failed one sleeps all of
            # it (it may have failed at once: never a busy loop)
            spent = now - started if files is not None else 0.0
            time.sleep(max(0.0, a["poll_interval"] - spent))
        silent = round(time.monotonic() - last_change)
        if snap is None or error:
            return {**result, "failed": True, "msg": f"cannot read {a['run_dir']}: {error}"}
        missing = ", ".join(h for h in hosts if h not in snap["exits"])
        result["msg"] = (
            f"run {run_id}: agents stopped reporting (progress.json and their logs unchanged "
            f"for {silent} s, no exit record from {missing}); see status.yml -e run_id={run_id}"
        )
        return self._done(result, snap, "lost", lines)

    @staticmethod
    def _done(result: dict, snap: dict, outcome: str, lines: list[str]) -> dict:
        keep = ("summary", "exits", "progress", "config", "attempt", "links", "checkpoints",
                "report", "plot")  # fmt: skip
        result.update({k: snap[k] for k in keep}, changed=False, outcome=outcome, lines=lines)
        return result
