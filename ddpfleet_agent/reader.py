"""Read a run's records on a node, for the controller (``ddpfleet_agent.follow``).

The follow plugin runs this file's text as root with the node's python3 (``python3 -c``), so it
uses the standard library only. As the storage owner's uid and gid, with no supplementary
groups (what the ranks may read), it prints EMITTED and nodes/*.exit, each behind a marker line:
regular files only, 1 MiB at most, no link followed (a container may plant nodes/x.exit ->
/etc/shadow). Then, each only when there is one, the records ``links`` (links among WATCHED and
below WALKED: train.yml refuses to act through them), ``logged`` (the size of each
nodes/*.log: the follow counts an agent's line as reporting), ``checkpoints`` (train.yml
refuses ``train_resume=never`` on them) and ``present`` (report.png, not read). Arguments:
run_dir uid gid marker [wait]: first re-read progress.json every TICK s until it says the run
ended or wait s passed, so the follow learns of the end within a tick, one command per wait s.
"""

import contextlib
import json
import os
import re
import stat
import sys
import time

NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
EMITTED = ("config.json", "summary.json", "progress.json", "report.txt")
WATCHED = ("config.json", "summary.json", "summary.trainer.json", "progress.json")
WATCHED += ("metrics.jsonl", "report.txt", "report.png", "agent.key", "nodes", "logs")
WATCHED += ("checkpoints", "code", "lib")  # what ddpfleet writes or reads: no link is taken
WALKED = ("nodes", "lib")  # every entry below these, to this depth
DEPTH = 6
CHECKPOINT = re.compile(r"step-\d{9}\.pt")  # trainer.checkpoint.NAME
ENDED = ("completed", "failed", "stopped")  # progress.json's status words of an ended run
TICK = 0.25  # s between reads of progress.json while waiting: 4 small reads a second


def opendir(name, parent=None):
    try:
        return os.open(name, NOFOLLOW | os.O_DIRECTORY, dir_fd=parent)
    except OSError:
        return None


def regular(parent, name, size=1 << 20):
    """The first ``size`` bytes of the regular file ``name`` in ``parent`` (an fd), else None."""
    try:
        fd = os.open(name, NOFOLLOW, dir_fd=parent)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read(size) if stat.S_ISREG(os.fstat(fd).st_mode) else None


def emit(out, mark, shown, parent, name):
    body = regular(parent, name)
    if body is not None:
        out.write(f"{mark} {shown}\n".encode() + body + b"\n")


def record(out, mark, name, values):
    """A record of names the reader found (links, checkpoints...), only when there is one."""
    if values:
        out.write(f"{mark} {name}\n{json.dumps({name: values})}\n".encode())


def wait_for_end(top, wait):
    """Re-read progress.json until it says the run ended (any attempt's: the follower checks
    which) or ``wait`` s passed. A torn file has not."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            rec = json.loads(regular(top, "progress.json") or b"")
        except ValueError:  # torn, partial or not UTF-8
            rec = None
        if isinstance(rec, dict) and rec.get("status") in ENDED:
            return
        time.sleep(max(0.0, min(TICK, deadline - time.monotonic())))


def links_below(parent, name, depth):
    """Relative names of the links below the directory ``name`` of ``parent``, to ``depth``."""
    child = opendir(name, parent)
    if child is None:
        return []
    found = []
    for entry in sorted(os.scandir(child), key=lambda e: e.name):
        if entry.is_symlink():
            found.append(f"{name}/{entry.name}")
        elif entry.is_dir(follow_symlinks=False) and depth > 0:
            found += [f"{name}/{n}" for n in links_below(child, entry.name, depth - 1)]
    os.close(child)
    return found


def main(run_dir, uid, gid, mark, wait=0.0):
    if os.getuid() != 0:
        sys.exit(
            "needs root on the node to act as the storage's owner: log in as root, or as a "
            "sudo user with ansible_become: true"
        )
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    out = sys.stdout.buffer
    try:
        top = os.open(run_dir, NOFOLLOW | os.O_DIRECTORY)
    except FileNotFoundError:
        return  # no such run
    except OSError as exc:  # unreadable: an error, not an absent run
        sys.exit(exc.strerror)  # the follow action says what could not be read
    wait_for_end(top, wait)  # none when wait is 0
    for name in EMITTED:
        emit(out, mark, name, top, name)
    nodes = opendir("nodes", top)
    logged = []  # each agent's log, "<name> <size>": it grows while an agent heals the run
    for name in sorted(os.listdir(nodes)) if nodes is not None else []:
        if name.endswith(".exit"):
            emit(out, mark, "nodes/" + name, nodes, name)
        elif name.endswith(".log"):
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=nodes, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    logged.append(f"{name} {st.st_size}")
    entries = {e.name: e for e in os.scandir(top)}  # no link followed
    links = []  # among WATCHED, and below WALKED
    for name in WATCHED:
        entry = entries.get(name)
        if entry is not None and entry.is_symlink():
            links.append(name)
        elif entry is not None and entry.is_dir(follow_symlinks=False) and name in WALKED:
            links += links_below(top, name, DEPTH)
    record(out, mark, "links", links)
    record(out, mark, "logged", logged)
    kept = opendir("checkpoints", top)
    names = os.listdir(kept) if kept is not None else []
    record(out, mark, "checkpoints", sorted(n for n in names if CHECKPOINT.fullmatch(n)))
    plot = "report.png" in entries and entries["report.png"].is_file(follow_symlinks=False)
    record(out, mark, "present", ["report.png"] if plot else [])


if __name__ == "__main__":
    wait = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], wait)
