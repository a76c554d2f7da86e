"""ddpfleet_run_lock: the launch lock of one run_id, a file on the shared storage.

state=present creates ``path`` atomically (O_CREAT|O_EXCL, as the storage's owner: root is
squashed on NFS) with who holds it: {"controller", "pid", "time", "attempt"}. A lock held by
someone else is waited for (up to ``timeout`` s), then refused with one line naming the
holder. A lock is stale, and taken over, when its holder was this controller and that
process is gone (a train.yml killed mid-launch), or when it is older than ``stale_after`` s.
state=absent removes the lock if this process holds it. Runs on the controller; the file
operations run on the task's host (rank 0's) with its python3 over the connection.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

SPEC = {
    "path": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "owner_uid": {"type": "int", "required": True},
    "owner_gid": {"type": "int", "required": True},
    "attempt": {"type": "str", "default": ""},
    "timeout": {"type": "float", "default": 120.0},
    "stale_after": {"type": "float", "default": 900.0},
    "poll": {"type": "float", "default": 1.0},
}

# python3 on the node as root (through become where the login is a sudo user), which drops to
# the owner with no supplementary groups. argv: path uid gid op
# [content [stale content]]. read: print the holder. take: create exclusively and write
# content (exit 0), or print the holder (exit 3). drop: remove the lock if it holds content.
# replace: remove the lock if it still holds the stale content, then take it.
REMOTE = r"""
import os, sys
path, uid, gid, op = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
mine = sys.argv[5] if len(sys.argv) > 5 else ""
if os.getuid() != 0:
    sys.exit("needs root on the node to act as the storage's owner: log in as root, or as a "
             "sudo user with ansible_become: true")
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
def held():
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as fh:
        return fh.read(4096)
def take():
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        sys.stdout.write(held() or "")
        sys.exit(3)
    with os.fdopen(fd, "w") as fh:
        fh.write(mine)
        fh.flush()
        os.fsync(fh.fileno())
if op == "read":
    sys.stdout.write(held() or "")
elif op == "take":
    take()
elif op in ("drop", "replace"):
    stale = sys.argv[6] if op == "replace" else mine
    if held() == stale:
        os.unlink(path)
    if op == "replace":
        take()
"""


def holder_is_stale(holder: dict, me: str, now: float, stale_after: float) -> str:
    """Why a lock is stale ('' when it is not): its holder on this controller is gone, or it
    is older than stale_after s, or it is unreadable (a torn write)."""
    if not holder:
        return "unreadable"
    age = now - float(holder.get("time") or 0)
    if holder.get("controller") == me and not _alive(int(holder.get("pid") or 0)):
        return f"its train.yml (pid {holder.get('pid')}) is gone"
    if age > stale_after:
        return f"it is {age:.0f} s old"
    return ""


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parse(text: str) -> dict:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = False

    def _remote(self, a: dict, op: str, *extra: str) -> tuple[int, str]:
        args = [a["path"], str(a["owner_uid"]), str(a["owner_gid"]), op, *extra]
        cmd = f"python3 -c {shlex.quote(REMOTE)} " + " ".join(shlex.quote(x) for x in args)
        res = self._low_level_execute_command(cmd, sudoable=True)
        if res.get("rc") not in (0, 3):
            raise AnsibleConnectionFailure((res.get("stderr") or "").strip()[-500:])
        return res["rc"], res.get("stdout", "")

    def run(self, tmp: object = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        _, a = self.validate_argument_spec(argument_spec=SPEC)
        me = socket.gethostname()
        # The worker is a child of ansible-playbook: the lock lives as long as that process.
        mine = json.dumps({"controller": me, "pid": os.getppid(), "attempt": a["attempt"],
                           "time": round(time.time(), 3)})  # fmt: skip
        try:
            if a["state"] == "absent":
                return self._release(result, a, me)
            return self._acquire(result, a, me, mine)
        except AnsibleConnectionFailure as exc:
            return {**result, "failed": True, "msg": f"run lock {a['path']}: {exc}"}

    def _acquire(self, result: dict, a: dict, me: str, mine: str) -> dict:
        start = time.monotonic()
        deadline = start + a["timeout"]
        while True:
            rc, out = self._remote(a, "take", mine)
            waited = round(time.monotonic() - start, 1)
            if rc == 0:
                return {**result, "changed": True, "held": _parse(mine), "waited": waited}
            holder = _parse(out)
            why = holder_is_stale(holder, me, time.time(), a["stale_after"])
            if why:
                rc, _ = self._remote(a, "replace", mine, out)
                if rc == 0:
                    return {**result, "changed": True, "held": _parse(mine), "waited": waited,
                            "took_over": f"a stale lock ({why}): {out.strip()}"}  # fmt: skip
                continue  # another train.yml took it over first: wait for that one
            if time.monotonic() >= deadline:
                return {
                    **result,
                    "failed": True,
                    "msg": f"run lock {a['path']} is held by train.yml on "
                    f"{holder.get('controller')} (pid {holder.get('pid')}) since "
                    f"{time.strftime('%H:%M:%S', time.gmtime(float(holder.get('time') or 0)))} "
                    f"UTC; waited {a['timeout']:.0f} s (a lock older than "
                    f"{a['stale_after']:.0f} s is taken over)",
                }
            time.sleep(a["poll"])

    def _release(self, result: dict, a: dict, me: str) -> dict:
        _, out = self._remote(a, "read")
        holder = _parse(out)
        if holder.get("controller") == me and holder.get("pid") == os.getppid():
            self._remote(a, "drop", out)
            return {**result, "changed": True}
        return {**result, "changed": False}
