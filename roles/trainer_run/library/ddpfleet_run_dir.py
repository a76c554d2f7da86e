#!/usr/bin/python
"""Create, clean, write and read files of a run directory as the shared storage's owner."""

from __future__ import annotations

import base64
import glob
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ddpfleet_run import as_owner, write_atomic

DOCUMENTATION = r"""
module: ddpfleet_run_dir
short_description: Manage files under a ddpfleet run directory as its owner uid/gid
description:
- NFS squashes root, so every write to shared storage drops to the owner's uid/gid first.
- Order of work is mkdirs, remove, files, read.
options:
  path:
    description: Run directory (or any directory on shared storage).
    type: path
    required: true
  mkdirs:
    description: Sub-directories to create (relative; "." is path itself).
    type: list
    elements: str
    default: []
  remove:
    description: Glob patterns (relative) of files to delete.
    type: list
    elements: str
    default: []
  files:
    description: Files to write atomically; each has path (relative), content or content_b64,
      and mode.
    type: list
    elements: dict
    default: []
  read:
    description: Relative paths to read; missing ones are left out of the result.
    type: list
    elements: str
    default: []
  uid:
    description: Owner uid.
    type: int
  gid:
    description: Owner gid.
    type: int
author: ddpfleet
"""

RETURN = r"""
content:
  description: Text of each file in read that exists, by relative path.
  type: dict
  returned: always
removed:
  description: Relative paths deleted.
  type: list
  returned: always
"""


def inside(root: str, rel: str) -> str:
    full = os.path.normpath(os.path.join(root, rel))
    if full != root and not full.startswith(root.rstrip("/") + "/"):
        raise ValueError(f"{rel} is outside {root}")
    return full


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "mkdirs": {"type": "list", "elements": "str", "default": []},
            "remove": {"type": "list", "elements": "str", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "read": {"type": "list", "elements": "str", "default": []},
            "uid": {"type": "int"},
            "gid": {"type": "int"},
        },
        supports_check_mode=False,
    )
    p = module.params
    root = os.path.normpath(p["path"])
    changed = False
    removed: list[str] = []
    content: dict[str, str] = {}
    try:
        with as_owner(p["uid"], p["gid"]):
            for rel in p["mkdirs"]:
                full = inside(root, rel)
                if not os.path.isdir(full):
                    os.makedirs(full, mode=0o755, exist_ok=True)
                    changed = True
            for pattern in p["remove"]:
                for full in sorted(glob.glob(inside(root, pattern))):
                    if os.path.isfile(full) or os.path.islink(full):
                        os.unlink(full)
                        removed.append(os.path.relpath(full, root))
                        changed = True
            for item in p["files"]:
                full = inside(root, str(item["path"]))
                if "content_b64" in item:
                    data = base64.b64decode(item["content_b64"])
                else:
                    data = str(item.get("content", "")).encode()
                mode = int(str(item.get("mode", "0644")), 8)
                changed |= write_atomic(full, data, mode)
            for rel in p["read"]:
                full = inside(root, rel)
                try:
                    with open(full, encoding="utf-8", errors="replace") as fh:
                        content[rel] = fh.read()
                except FileNotFoundError:
                    continue
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"{root}: {exc}")
    module.exit_json(changed=changed, content=content, removed=removed)


if __name__ == "__main__":
    main()
