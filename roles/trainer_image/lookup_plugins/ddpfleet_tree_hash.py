"""Lookup ``ddpfleet_tree_hash``: one sha256 over files and directory trees on the controller.

The trainer_image role tags the image with this hash (plus the base image ID and the
wheelhouse listing), so unchanged sources mean no rebuild and no push.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: ddpfleet_tree_hash
short_description: sha256 over files and directory trees on the controller
description:
  - Hashes every regular file under the given paths (relative to O(root)), in sorted order of
    their relative paths, with the path, whether it is executable, and its content.
  - Skips C(__pycache__), C(*.egg-info), C(.pytest_cache) directories and C(*.pyc) files, so
    running the tests or installing the package does not change the hash.
options:
  _terms:
    description: Files or directories, relative to O(root).
    required: true
  root:
    description: Directory the terms are relative to.
    type: path
    required: true
"""

RETURN = r"""
_raw:
  description: One element, the hex sha256 digest.
  type: list
  elements: str
"""

SKIP_DIRS = frozenset({"__pycache__", ".pytest_cache"})
SKIP_DIR_SUFFIXES = (".egg-info",)
SKIP_FILE_SUFFIXES = (".pyc", ".pyo")


def _files(root: Path, term: str) -> Iterator[Path]:
    path = root / term
    if path.is_file():
        yield path
        return
    if not path.is_dir():
        raise AnsibleLookupError(f"ddpfleet_tree_hash: {path} is neither a file nor a directory")
    for current, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(SKIP_DIR_SUFFIXES)]
        for name in names:
            if not name.endswith(SKIP_FILE_SUFFIXES):
                yield Path(current) / name


def tree_hash(root: Path, terms: list[str]) -> str:
    """The hex sha256 over every file under ``terms`` (relative to ``root``)."""
    if not terms:
        raise AnsibleLookupError("ddpfleet_tree_hash: give at least one file or directory")
    root = root.resolve()
    files = {
        path.relative_to(root).as_posix(): path for term in terms for path in _files(root, term)
    }
    digest = hashlib.sha256()
    for rel in sorted(files):
        path = files[rel]
        executable = b"x" if os.access(path, os.X_OK) else b"-"
        digest.update(rel.encode() + b"\0" + executable + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


class LookupModule(LookupBase):
    def run(self, terms: list[str], variables: dict | None = None, **kwargs: object) -> list[str]:
        self.set_options(var_options=variables, direct=kwargs)
        root = Path(str(self.get_option("root")))
        if not root.is_dir():
            raise AnsibleLookupError(f"ddpfleet_tree_hash: root {root} is not a directory")
        return [tree_hash(root, [str(term) for term in terms])]
