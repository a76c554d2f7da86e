"""Read a run's records on a node, for the controller (``trainer.agent.follow``).

Not imported: the follow plugin runs this file's text with the node's own python3 (``python3
-c``, as root through become), so it uses the standard library only. It drops to the storage
owner's uid and gid with no supplementary groups (what the ranks themselves may read), then
prints config.json, summary.json, progress.json and nodes/*.exit, each behind a marker line,
without following a link (a container may plant one: nodes/x.exit -> /etc/shadow), regular
files only, at most 1 MiB each. Arguments: run_dir uid gid marker.
"""

import os
import stat
import sys

NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


def opendir(name, parent=None):
    try:
        return os.open(name, NOFOLLOW | os.O_DIRECTORY, dir_fd=parent)
    except OSError:
        return None


def emit(out, mark, shown, parent, name):
    try:
        fd = os.open(name, NOFOLLOW, dir_fd=parent)
    except OSError:
        return
    with os.fdopen(fd, "rb") as fh:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            out.write(f"{mark} {shown}\n".encode() + fh.read(1 << 20) + b"\n")


def main(run_dir, uid, gid, mark):
    if os.getuid() != 0:
        sys.exit(
            "needs root on the node to act as the storage's owner: log in as root, or as a "
            "sudo user with ansible_become: true"
        )
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    out = sys.stdout.buffer
    top = opendir(run_dir)
    if top is None:
        return
    for name in ("config.json", "summary.json", "progress.json"):
        emit(out, mark, name, top, name)
    nodes = opendir("nodes", top)
    for name in sorted(os.listdir(nodes)) if nodes is not None else []:
        if name.endswith(".exit"):
            emit(out, mark, "nodes/" + name, nodes, name)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
