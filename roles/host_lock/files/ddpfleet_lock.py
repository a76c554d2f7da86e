#!/usr/bin/env python3
"""ddpfleet's one lock: a small JSON file on a host naming its holder, with a lease.

Used for the registry host's image build lock (roles/trainer_image) and for a run_id's launch
lock on the shared storage (roles/trainer_run); the controller side is the ddpfleet_lock
action plugin beside this role's files, which runs this file with the node's python3.

The record: host (the controller), pid (its ansible-playbook), attempt, token (random, known
only to the holder: renew and release act only for it), time/started (when taken), lease_s
and expires. A lock is stale, and taken over, once ``expires`` has passed: the holder renews
its lease between the steps it works through (``renew``), so a live holder never goes stale,
and a dead one does after at most one lease. ``--break-token`` takes over only the lock that
holds that token (the controller saw that its holder's process on the same controller is
gone). A record without ``expires`` (an older ddpfleet's) expires ``lease_s`` after its
``time``; an unreadable one (a crash while writing, a planted link) ``--lease`` s after its
modification.

Atomicity: every read-decide-write runs under an exclusive POSIX record lock (fcntl.lockf)
on ``<dir>/.ddpfleet-lock.guard``, so taking, taking over, renewing and releasing are atomic
among all callers. Why a guard and not rename-the-stale-file: after A renames the stale file
away and creates its own, a slower B, which judged the same stale file, renames A's fresh
lock away instead; B can see that, but cannot put A's lock back without a window in which a
third caller creates the file. A record lock needs no stale rule of its own: the kernel (on
NFSv4, the server's lease on the client) drops it when its process dies. POSIX, not flock:
the Linux NFS client maps flock to POSIX locks on the server, where a local flock on the
server's own file system would not exclude them. The guard wait is bounded (``GUARD_S``).
The lock itself is still created with O_CREAT|O_EXCL|O_NOFOLLOW and replaced by rename, so a
reader without the guard never sees half a record and no planted link is followed.

    ddpfleet_lock.py acquire --path P --token T --host H --pid N --lease S
                     [--attempt A] [--break-token T2] [--owner UID:GID]
    ddpfleet_lock.py renew   --path P --token T --lease S [--owner UID:GID]
    ddpfleet_lock.py release --path P --token T [--owner UID:GID]
    ddpfleet_lock.py show    --path P [--owner UID:GID]

--mkdir: create the lock's directory (0755) first. --owner: run as root, drop to that uid
and gid with no supplementary groups first (the shared storage squashes root).

Exit codes: 0 done, 3 held by someone else (acquire) or not ours (renew), 2 bad usage or
an OS error. Every result is one JSON line on stdout; holders are shown without their token,
except by show (the controller may need it to break a lock).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

HELD = 3
GUARD_S = 60.0
NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK


@contextlib.contextmanager
def guarded(path: str) -> Iterator[None]:
    """Hold an exclusive record lock on the directory's guard file for the block."""
    guard = os.path.join(os.path.dirname(path) or ".", ".ddpfleet-lock.guard")
    fd = os.open(guard, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + GUARD_S
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # drops the record lock


def read(path: str, lease: float) -> dict[str, Any] | None:
    """The holder recorded in ``path`` with its ``expires``; None without a lock."""
    try:
        mtime = os.lstat(path).st_mtime
    except FileNotFoundError:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
        with os.fdopen(fd) as handle:
            holder = json.loads(handle.read(65536))
    except (OSError, ValueError):
        holder = None
    if not isinstance(holder, dict) or not isinstance(holder.get("time"), (int, float)):
        holder = {"host": "?", "pid": 0, "time": mtime, "token": "", "unreadable": True}
    if not isinstance(holder.get("expires"), (int, float)):
        holder["expires"] = float(holder["time"]) + float(holder.get("lease_s") or lease)
    return holder


def write(path: str, holder: dict[str, Any], replace: bool) -> None:
    """Create ``path`` (O_EXCL), or replace it by rename so no reader sees half a record."""
    target = f"{path}.{os.getpid()}.tmp" if replace else path
    mode = os.O_TRUNC if replace else os.O_EXCL  # a temp name is ours: under the guard
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | mode | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(holder) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    if replace:
        os.replace(target, path)


def public(holder: dict[str, Any] | None, now: float) -> dict[str, Any] | None:
    """The holder without its token, plus its age and the seconds its lease has left."""
    if holder is None:
        return None
    shown = {k: v for k, v in holder.items() if k != "token"}
    shown["age_s"] = round(now - float(holder["time"]), 1)
    shown["left_s"] = round(float(holder["expires"]) - now, 1)
    return shown


def acquire(args: argparse.Namespace) -> int:
    with guarded(args.path):
        holder, now = read(args.path, args.lease), time.time()
        if holder is not None and holder.get("token") == args.token:
            print(json.dumps({"acquired": True, "took_over": None}))  # ours (a retried task)
            return 0
        broken = bool(args.break_token) and holder is not None
        broken = broken and holder.get("token") == args.break_token
        if holder is not None and not broken and now <= float(holder["expires"]):
            print(json.dumps({"acquired": False, "holder": public(holder, now)}))
            return HELD
        if holder is not None:
            os.unlink(args.path)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        mine = {"host": args.host, "pid": args.pid, "attempt": args.attempt, "time": now,
                "started": started, "lease_s": args.lease, "expires": now + args.lease,
                "token": args.token}  # fmt: skip
        write(args.path, mine, replace=False)
    print(json.dumps({"acquired": True, "took_over": public(holder, now)}))
    return 0


def renew(args: argparse.Namespace) -> int:
    with guarded(args.path):
        holder, now = read(args.path, args.lease), time.time()
        ours = holder is not None and holder.get("token") == args.token
        if ours:
            write(args.path, {**holder, "lease_s": args.lease, "expires": now + args.lease}, True)
    print(json.dumps({"renewed": ours, "holder": None if ours else public(holder, now)}))
    return 0 if ours else HELD


def release(args: argparse.Namespace) -> int:
    with guarded(args.path):
        holder, now = read(args.path, 0.0), time.time()
        ours = holder is not None and holder.get("token") == args.token
        if ours:
            os.unlink(args.path)
    print(json.dumps({"released": ours, "holder": None if ours else public(holder, now)}))
    return 0


def show(args: argparse.Namespace) -> int:
    with guarded(args.path):
        holder, now = read(args.path, 0.0), time.time()
    shown = public(holder, now)
    if shown is not None and holder is not None:
        shown["token"] = holder.get("token", "")
    print(json.dumps({"holder": shown}))
    return 0


def drop_to(owner: str) -> None:
    """Become the storage's owner (uid:gid, no supplementary groups); needs root."""
    uid, _, gid = owner.partition(":")
    if os.getuid() != 0:
        sys.exit("needs root on the node to act as the storage's owner: log in as root, or as "
                 "a sudo user with ansible_become: true")  # fmt: skip
    os.setgroups([])
    os.setgid(int(gid))
    os.setuid(int(uid))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ddpfleet_lock.py")
    sub = parser.add_subparsers(dest="action", required=True)
    ops = {name: sub.add_parser(name) for name in ("acquire", "renew", "release", "show")}
    for name, op in ops.items():
        op.add_argument("--path", required=True)
        op.add_argument("--owner", default="", help="uid:gid to drop to (as root)")
        op.add_argument("--mkdir", action="store_true", help="create the lock's directory")
        if name != "show":
            op.add_argument("--token", required=True)
        if name in ("acquire", "renew"):
            op.add_argument("--lease", type=float, required=True)
    ops["acquire"].add_argument("--host", required=True)
    ops["acquire"].add_argument("--pid", type=int, required=True)
    ops["acquire"].add_argument("--attempt", default="")
    ops["acquire"].add_argument("--break-token", default="")
    args = parser.parse_args(argv)
    if getattr(args, "token", "x") == "":
        parser.error("--token must not be empty")
    if getattr(args, "lease", 1.0) <= 0:
        parser.error("--lease must be above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        if args.owner:
            drop_to(args.owner)
        if args.mkdir:
            os.makedirs(os.path.dirname(args.path) or ".", mode=0o755, exist_ok=True)
        run = {"acquire": acquire, "renew": renew, "release": release, "show": show}
        return run[args.action](args)
    except (OSError, ValueError) as exc:
        print(f"ddpfleet_lock.py: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
