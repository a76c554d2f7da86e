#!/usr/bin/python
"""Read, in one module run, what preflight and the later roles would otherwise each ask for."""

from __future__ import annotations

import os
import re

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ddpfleet_host_probe
short_description: Free space, nvidia-smi, packages, services, accounts and files, in one run
description:
- Reads the free space of the filesystem that holds C(disk_path), whether nvidia-smi is there,
  dpkg's status database, systemd's unit states and the local user and group files. site.yml's
  roles skip an apt task when every package it asks for is installed, a start task when its
  service is active and enabled, and a user or group task when the local account is already as
  asked (each falls back to doing the work where the probe did not run, e.g. on another OS, or
  where an account is not in the local files). It also says which of C(exists) are there and
  which lines of a file match a pattern (C(lines)), with each one's owner and mode, and the text
  of small files (C(texts)), for a role's read or file task that a no-op skips.
- It only reads, so it runs in check mode too.
options:
  disk_path:
    description: A path whose filesystem is measured; it need not exist yet (/var/lib/docker
      before Docker is installed), and then its nearest existing parent is.
    type: path
    required: true
  nvidia_smi:
    description: Where nvidia-smi would be; C(nvidia_smi) says whether it is a file there.
    type: path
  dpkg_status:
    description: dpkg's status file.
    type: path
    default: /var/lib/dpkg/status
  passwd:
    description: The local user database.
    type: path
    default: /etc/passwd
  group:
    description: The local group database.
    type: path
    default: /etc/group
  exists:
    description: Paths to look for.
    type: list
    elements: path
    default: []
  lines:
    description: Each path's pattern (a Python regular expression, matched at a line's start).
    type: dict
    default: {}
  texts:
    description: Paths to read whole (small text files a later role reads, such as daemon.json).
    type: list
    elements: path
    default: []
author: ddpfleet
"""

RETURN = r"""
disk:
  description: The mount point holding C(disk_path) and the bytes available there to non-root
    users (what Docker's images may fill), as the mount facts' C(size_available).
  type: dict
  returned: always
nvidia_smi:
  description: Whether C(nvidia_smi) is a file (false when not asked).
  type: bool
  returned: always
packages:
  description: Names of the packages dpkg has installed (status "install ok installed"); empty
    where there is no dpkg.
  type: list
  elements: str
  returned: always
services:
  description: Service units (e.g. docker.service) that are both active and enabled; empty where
    systemctl does not answer.
  type: list
  elements: str
  returned: always
users:
  description: Each local user's C([uid, gid, home, shell]), by name.
  type: dict
  returned: always
groups:
  description: Each local group's gid, by name.
  type: dict
  returned: always
exists:
  description: Those of C(exists) that are there, each with its C(uid), C(gid) and C(mode) (an
    octal string, "0600"), not following a link.
  type: dict
  returned: always
lines:
  description: Each of C(lines)' paths, with its lines that match its pattern (none where the
    file is missing).
  type: dict
  returned: always
texts:
  description: Those of C(texts) that are files, each with its text.
  type: dict
  returned: always
"""


def disk(path: str) -> dict[str, object]:
    """The mount point that holds ``path`` (or would, once created) and its available bytes."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    fs = os.statvfs(path)
    mount = path
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    return {"mount": mount, "size_available": fs.f_bavail * fs.f_frsize}


def installed(status_text: str) -> list[str]:
    """Package names whose dpkg status record says "install ok installed"."""
    names = []
    for record in status_text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in record.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Status") == "install ok installed" and "Package" in fields:
            names.append(fields["Package"])
    return sorted(set(names))


def up(units_text: str, files_text: str) -> list[str]:
    """Units active in ``systemctl list-units`` and enabled in ``systemctl list-unit-files``
    (both run with --plain --no-legend: UNIT LOAD ACTIVE SUB ... and UNIT STATE [PRESET])."""
    active = {
        r[0] for r in map(str.split, units_text.splitlines()) if len(r) > 2 and r[2] == "active"
    }
    enabled = {
        r[0] for r in map(str.split, files_text.splitlines()) if len(r) > 1 and r[1] == "enabled"
    }
    return sorted(active & enabled)


def accounts(text: str, fields: tuple[int, ...]) -> dict[str, list[object]]:
    """name -> the chosen colon-separated fields of a passwd or group file (numbers as ints)."""
    out: dict[str, list[object]] = {}
    for line in text.splitlines():
        row = line.split(":")
        if len(row) > max(fields) and row[0] and not row[0].startswith(("#", "+", "-")):
            out[row[0]] = [int(row[i]) if row[i].isdigit() else row[i] for i in fields]
    return out


def read(path: str) -> str:
    """The file's text, or "" where it is missing."""
    if not os.path.isfile(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def owner_and_mode(paths: list[str]) -> dict[str, dict[str, object]]:
    """Each of ``paths`` that is there, with its uid, gid and permission bits ("0600")."""
    found = {}
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        found[path] = {"uid": st.st_uid, "gid": st.st_gid, "mode": f"{st.st_mode & 0o7777:04o}"}
    return found


def matching(text: str, pattern: str) -> list[str]:
    """The lines of ``text`` that match ``pattern`` at their start."""
    found = re.compile(pattern)
    return [line for line in text.splitlines() if found.match(line)]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "disk_path": {"type": "path", "required": True},
            "nvidia_smi": {"type": "path"},
            "dpkg_status": {"type": "path", "default": "/var/lib/dpkg/status"},
            # a path, not a secret: no_log said outright, or every run warns it is not set
            "passwd": {"type": "path", "default": "/etc/passwd", "no_log": False},
            "group": {"type": "path", "default": "/etc/group"},
            "exists": {"type": "list", "elements": "path", "default": []},
            "lines": {"type": "dict", "default": {}},
            "texts": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    packages = installed(read(module.params["dpkg_status"]))
    services: list[str] = []
    systemctl = module.get_bin_path("systemctl")
    if systemctl:
        common = ["--type=service", "--plain", "--no-legend", "--no-pager"]
        rc1, units, _ = module.run_command([systemctl, "list-units", "--all", *common])
        rc2, files, _ = module.run_command([systemctl, "list-unit-files", *common])
        if rc1 == 0 and rc2 == 0:
            services = up(units, files)
    smi = module.params["nvidia_smi"]
    module.exit_json(
        changed=False,
        disk=disk(module.params["disk_path"]),
        nvidia_smi=bool(smi) and os.path.isfile(smi),
        packages=packages,
        services=services,
        users=accounts(read(module.params["passwd"]), (2, 3, 5, 6)),
        groups={k: v[0] for k, v in accounts(read(module.params["group"]), (2,)).items()},
        exists=owner_and_mode(module.params["exists"]),
        lines={p: matching(read(p), str(rx)) for p, rx in module.params["lines"].items()},
        texts={p: read(p) for p in module.params["texts"] if os.path.isfile(p)},
    )


if __name__ == "__main__":
    main()
