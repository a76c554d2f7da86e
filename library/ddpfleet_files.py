#!/usr/bin/python
"""The node side of the ddpfleet_files action (action_plugins/ddpfleet_files.py)."""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ddpfleet_files
short_description: Check and settle many files and directories in one module run
description:
- Meant to be called by the action of the same name, which renders or reads each file's content
  on the controller and passes its SHA-1 here. Each directory is created where missing; each
  file or directory whose owner, group or mode is off gets them; each file whose content is
  missing or differs is only reported (C(content)), and the action writes it with
  ansible.builtin.copy or ansible.builtin.template.
- In check mode nothing is changed; what would change is reported.
options:
  files:
    description: Each with C(dest), C(state) (file or directory), C(owner), C(group) (names or
      numeric ids), C(mode) (octal string) and, for a file, C(checksum) (SHA-1 of the content
      it should have).
    type: list
    elements: dict
    required: true
author: ddpfleet
"""

RETURN = r"""
results:
  description: Per entry, in order, C(dest) and C(status) - C(ok), C(created) (a directory),
    C(attributes) (owner, group or mode set) or C(content) (the action must write it).
  type: list
  elements: dict
  returned: always
"""


def sha1(path: str) -> str:
    digest = hashlib.sha1()  # the checksum Ansible's copy compares, not for security
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wanted_ids(entry: dict) -> tuple[int, int, int]:
    """uid, gid and permission bits the entry asks for (ValueError naming what is unknown)."""
    owner, group = str(entry["owner"]), str(entry["group"])
    try:
        uid = int(owner) if owner.isdigit() else pwd.getpwnam(owner).pw_uid
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError as exc:
        raise ValueError(f"{entry['dest']}: no such user or group {exc}") from None
    try:
        mode = int(str(entry["mode"]), 8)
    except ValueError:
        raise ValueError(f"{entry['dest']}: mode {entry['mode']!r} is not octal") from None
    return uid, gid, mode


def settle(entry: dict, check: bool) -> tuple[str, dict]:
    """One entry's status, after fixing what this side fixes; and its diff (before/after)."""
    dest, kind = entry["dest"], entry["state"]
    uid, gid, mode = wanted_ids(entry)
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        if kind == "file":
            return "content", {}
        if not check:
            os.makedirs(dest, mode)  # missing parents too, as ansible.builtin.file does
            os.chown(dest, uid, gid)
            os.chmod(dest, mode)
        return "created", {"before": {"path": dest, "state": "absent"},
                           "after": {"path": dest, "state": "directory"}}  # fmt: skip
    if kind == "directory" and not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{dest} exists and is not a directory")
    if kind == "file" and (not stat.S_ISREG(st.st_mode) or sha1(dest) != entry["checksum"]):
        return "content", {}
    have = {"owner": st.st_uid, "group": st.st_gid, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}
    want = {"owner": uid, "group": gid, "mode": f"{mode:04o}"}
    if have == want:
        return "ok", {}
    if not check:
        os.chown(dest, uid, gid)
        os.chmod(dest, mode)
    return "attributes", {"before": {"path": dest, **have}, "after": {"path": dest, **want}}


def main() -> None:
    module = AnsibleModule(
        argument_spec={"files": {"type": "list", "elements": "dict", "required": True}},
        supports_check_mode=True,
    )
    results, diffs = [], []
    for entry in module.params["files"]:
        try:
            status, diff = settle(entry, module.check_mode)
        except (OSError, ValueError) as exc:
            module.fail_json(msg=str(exc), results=results)
        results.append({"dest": entry["dest"], "status": status})
        if diff:
            diffs.append(diff)
    changed = any(r["status"] in ("created", "attributes") for r in results)
    module.exit_json(changed=changed, results=results, diff=diffs)


if __name__ == "__main__":
    main()
