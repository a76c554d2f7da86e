"""Files of the run directory, written whole and read without following links: the shared
storage's primitives of the agent (``records.py`` queues them off its loop) and the trainer."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

# How long the agent waits for one read of the shared storage before it counts the storage as
# gone (a hard NFS mount whose server died blocks a read for ever).
STORAGE_READ_TIMEOUT = 10.0


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write through a temp file beside path and os.replace: a reader sees old or new, whole."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: object, indent: int | None = 2) -> None:
    """JSON, keys sorted (indent None: one line)."""
    write_bytes_atomic(path, (json.dumps(obj, indent=indent, sort_keys=True) + "\n").encode())


def read_json(path: Path) -> dict:
    """A JSON object file; {} when missing, unreadable or not an object. Never follows links."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return {}
    with os.fdopen(fd, encoding="utf-8", errors="replace") as fh, contextlib.suppress(ValueError):
        data = json.load(fh)
        return data if isinstance(data, dict) else {}
    return {}


def call_within(fn, timeout: float) -> list:
    """fn() on a daemon thread of its own, waited for ``timeout`` s: [its value], or [] when
    it did not return in time (the thread is left blocked; the caller goes on)."""
    box: list = []
    worker = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    worker.start()
    worker.join(timeout)
    return box


def append_line(path: Path, line: str, mode: int = 0o640) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(line if line.endswith("\n") else line + "\n")


def tail_lines(path: Path, count: int) -> list[str]:
    """The last `count` non-empty lines of a text file (no link followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as fh:
        fh.seek(max(fh.seek(0, os.SEEK_END) - 65536, 0))
        text = fh.read().decode("utf-8", "replace")
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    return lines[-count:] if count > 0 else []
