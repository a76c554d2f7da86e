#!/usr/bin/env python3
"""The registry host's image build lock (ddpfleet, roles/trainer_image).

Two site.yml runs at once must not build, tag and push the training image over each other.
The lock is a small JSON file on the registry host naming its holder: the controller's host
name, the ansible-playbook pid there, the time it was taken, and a random token that only
its holder knows (release removes the lock only for that token). Every read-decide-write
happens under an flock on ``<path>.guard``, so taking, taking over and releasing are atomic
among concurrent callers on this host; the file itself is created with O_EXCL and replaced
with rename.

A lock is stale, and taken over, when it is older than ``--stale-after`` seconds (longer
than a build and push can take) or when the caller names its token in ``--break-token``
(the controller saw that the holder's process on the same controller is gone).

    ddpfleet_image_lock.py acquire --path P --token T --host H --pid N
                           [--stale-after S] [--wait S] [--break-token T2]
    ddpfleet_image_lock.py release --path P --token T
    ddpfleet_image_lock.py show --path P

Exit codes: 0 done (acquire: the lock is ours), 3 acquire gave up waiting (the holder is
printed), 2 bad usage. Every result is one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HELD = 3
POLL_S = 5.0


@contextlib.contextmanager
def guarded(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``<path>.guard`` (created 0600) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd = os.open(f"{path}.guard", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read(path: Path) -> dict[str, Any] | None:
    """The holder recorded in ``path``; None without a lock. A file that is not a JSON
    object (a crash while writing) counts as held since its modification time."""
    try:
        text = path.read_text()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        holder = None
    if not isinstance(holder, dict) or not isinstance(holder.get("time"), (int, float)):
        return {"host": "?", "pid": 0, "time": mtime, "token": "", "unreadable": True}
    return holder


def write_new(path: Path, holder: dict[str, Any]) -> None:
    """Create ``path`` holding ``holder``; it must not exist (O_EXCL)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w") as handle:
        json.dump(holder, handle)
        handle.write("\n")


def try_take(args: argparse.Namespace) -> tuple[bool, dict[str, Any] | None]:
    """One attempt: (True, replaced stale holder or None) or (False, current holder)."""
    path = Path(args.path)
    with guarded(path):
        holder = read(path)
        now = time.time()
        stale = holder is not None and (
            now - float(holder["time"]) > args.stale_after
            or (bool(args.break_token) and holder.get("token") == args.break_token)
        )
        if holder is not None and holder.get("token") == args.token:
            return True, None  # ours already (a retried task)
        if holder is not None and not stale:
            return False, holder
        if stale:
            os.unlink(path)
        write_new(
            path,
            {
                "host": args.host,
                "pid": args.pid,
                "time": now,
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
                "token": args.token,
            },
        )
        return True, holder


def public(holder: dict[str, Any] | None) -> dict[str, Any] | None:
    """The holder without its token (tokens are only for their owner), plus its age."""
    if holder is None:
        return None
    shown = {k: v for k, v in holder.items() if k != "token"}
    shown["age_s"] = round(time.time() - float(holder["time"]), 1)
    return shown


def acquire(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.wait
    waited = False
    while True:
        taken, holder = try_take(args)
        if taken:
            print(json.dumps({"acquired": True, "waited": waited, "took_over": public(holder)}))
            return 0
        if time.monotonic() >= deadline:
            print(json.dumps({"acquired": False, "holder": public(holder)}))
            return HELD
        waited = True
        time.sleep(min(args.poll, max(0.1, deadline - time.monotonic())))


def release(args: argparse.Namespace) -> int:
    path = Path(args.path)
    with guarded(path):
        holder = read(path)
        ours = holder is not None and holder.get("token") == args.token
        if ours:
            os.unlink(path)
    print(json.dumps({"released": ours, "holder": None if ours else public(holder)}))
    return 0


def show(args: argparse.Namespace) -> int:
    path = Path(args.path)
    with guarded(path):
        holder = read(path)
    shown = public(holder)
    if shown is not None and holder is not None:
        shown["token"] = holder.get("token", "")  # the controller may need it to break a lock
    print(json.dumps({"holder": shown}))
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ddpfleet_image_lock.py")
    sub = parser.add_subparsers(dest="action", required=True)
    take = sub.add_parser("acquire")
    take.add_argument("--path", required=True)
    take.add_argument("--token", required=True)
    take.add_argument("--host", required=True)
    take.add_argument("--pid", type=int, required=True)
    take.add_argument("--stale-after", type=float, default=7200.0)
    take.add_argument("--wait", type=float, default=0.0)
    take.add_argument("--break-token", default="")
    take.add_argument("--poll", type=float, default=POLL_S, help=argparse.SUPPRESS)
    free = sub.add_parser("release")
    free.add_argument("--path", required=True)
    free.add_argument("--token", required=True)
    look = sub.add_parser("show")
    look.add_argument("--path", required=True)
    args = parser.parse_args(argv)
    if getattr(args, "token", "x") == "":
        parser.error("--token must not be empty")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        return {"acquire": acquire, "release": release, "show": show}[args.action](args)
    except OSError as exc:
        print(f"ddpfleet_image_lock.py: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
