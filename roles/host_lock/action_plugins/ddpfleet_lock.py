"""ddpfleet_lock: take, renew or release a lock file on the task's host (ddpfleet's one lock).

The node side is this role's files/ddpfleet_lock.py, run with the host's python3 through
become (``owner_uid``/``owner_gid``: it drops to that owner, as on root-squashed storage;
``make_dir``: it creates the lock's directory first).

state=present takes the lock with a lease of ``lease`` s, waiting up to ``timeout`` s for
another holder; a holder on this controller whose ansible-playbook is gone is broken at once.
Returns acquired, token (pass it to renewed/absent), waited, took_over (the stale holder and
why) or holder (who has it, when not acquired: the role words the failure). state=renewed
extends the lease by ``lease`` s from now, and fails when the lock is no longer ours (its
lease ran out and another run took it over). state=absent removes it if ``token`` holds it.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
import time
from pathlib import Path

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

NODE = (Path(__file__).resolve().parents[1] / "files" / "ddpfleet_lock.py").read_text()
SPEC = {
    "path": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["present", "renewed", "absent"], "default": "present"},
    "token": {"type": "str", "default": ""},
    "owner_uid": {"type": "int", "default": -1},
    "owner_gid": {"type": "int", "default": -1},
    "attempt": {"type": "str", "default": ""},
    "timeout": {"type": "float", "default": 0.0},
    "lease": {"type": "float", "default": 900.0},
    "poll": {"type": "float", "default": 1.0},
    "make_dir": {"type": "bool", "default": False},
}


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = False

    def _node(self, a: dict, op: str, *extra: str) -> tuple[int, dict]:
        args = [op, "--path", a["path"], *extra]
        if a["owner_uid"] >= 0:
            args += ["--owner", f"{a['owner_uid']}:{a['owner_gid']}"]
        args += ["--mkdir"] if a["make_dir"] else []
        cmd = f"python3 -c {shlex.quote(NODE)} " + " ".join(shlex.quote(x) for x in args)
        res = self._low_level_execute_command(cmd, sudoable=True)
        if res.get("rc") not in (0, 3):
            raise AnsibleConnectionFailure((res.get("stderr") or "").strip()[-500:])
        return res["rc"], json.loads(res.get("stdout") or "{}")

    def run(self, tmp: object = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        _, a = self.validate_argument_spec(argument_spec=SPEC)
        if a["state"] != "present" and not a["token"]:
            return {**result, "failed": True, "msg": f"state={a['state']} needs the token"}
        try:
            if a["state"] == "present":
                return {**result, **self._acquire(a)}
            lease = ["--lease", str(a["lease"])] if a["state"] == "renewed" else []
            op = "renew" if a["state"] == "renewed" else "release"
            rc, out = self._node(a, op, "--token", a["token"], *lease)
        except (AnsibleConnectionFailure, ValueError) as exc:
            return {**result, "failed": True, "msg": f"lock {a['path']}: {exc}"}
        if rc == 0:
            return {**result, "changed": bool(out.get("released", out.get("renewed")))}
        held = out.get("holder") or {}
        return {**result, "failed": True, "msg": f"lock {a['path']} is no longer ours: " + (
            f"held by ansible-playbook pid {held.get('pid')} on {held.get('host')} since "
            f"{held.get('started')}" if held else "it was removed")}  # fmt: skip

    def _acquire(self, a: dict) -> dict:
        token, me = a["token"] or secrets.token_hex(12), socket.gethostname()
        # The worker is a child of ansible-playbook: the lock lives as long as that process.
        mine = ["--token", token, "--host", me, "--pid", str(os.getppid()),
                "--lease", str(a["lease"]), "--attempt", a["attempt"]]  # fmt: skip
        start, broken, why = time.monotonic(), [], ""
        while True:
            rc, out = self._node(a, "acquire", *mine, *broken)
            waited = round(time.monotonic() - start, 1)
            if rc == 0:
                took = out.get("took_over")
                if took:
                    why = why or f"its lease ran out {-float(took.get('left_s', 0)):.0f} s ago"
                    took["why"] = why
                return {"changed": True, "acquired": True, "token": token, "waited": waited,
                        "took_over": took}  # fmt: skip
            holder = out.get("holder") or {}
            if not broken and holder.get("host") == me and not alive(int(holder.get("pid") or 0)):
                _, seen = self._node(a, "show")  # the token, to break only that lock
                broken = ["--break-token", (seen.get("holder") or {}).get("token") or "-"]
                why = f"its ansible-playbook (pid {holder.get('pid')}) is gone"
                continue
            if time.monotonic() - start >= a["timeout"]:
                return {"changed": False, "acquired": False, "waited": waited, "holder": holder}
            time.sleep(a["poll"])
