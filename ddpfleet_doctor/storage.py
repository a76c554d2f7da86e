"""The doctor's storage check: how fast this host reads the shared dataset directory and how
many of its JPEGs one core decodes with PIL. No torch.

Each host starts at its own offset in the sorted file list (``--host-index`` of
``--hosts``), so the hosts read different files at the same time, as a run's ranks do. The
client's page cache is dropped for each file before it is read (``posix_fadvise``
DONTNEED), so a file read earlier is read from the storage again; the server's cache stays.
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

from PIL import Image

SUFFIXES = (".jpg", ".jpeg")
SCAN_LIMIT = 200_000  # directory entries looked at before giving up on finding more JPEGs


def find_jpegs(root: Path, limit: int = SCAN_LIMIT) -> list[Path]:
    """JPEGs under ``root`` in a stable order (sorted walk), at most ``limit`` entries seen."""
    found, seen = [], 0
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            seen += 1
            if name.lower().endswith(SUFFIXES):
                found.append(Path(folder) / name)
        if seen >= limit:
            break
    return found


def share(files: list, host_index: int, hosts: int, count: int) -> list:
    """``count`` files starting at this host's offset (wrapping), different for each host."""
    if not files:
        return []
    start = host_index * len(files) // max(1, hosts)
    rotated = files[start:] + files[:start]
    return rotated[:count]


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def run(data_dir: str, host_index: int, hosts: int, files: int, seconds: float) -> dict:
    """{read_mb_per_sec, jpegs_per_sec, ...}, or {"skipped": why} without JPEGs."""
    root = Path(data_dir)
    if not root.is_dir():
        return {"skipped": f"{data_dir} is not a directory here"}
    chosen = share(find_jpegs(root), host_index, hosts, files)
    if not chosen:
        return {"skipped": f"no JPEGs under {data_dir}"}
    blobs, start = [], time.perf_counter()
    for path in chosen:
        blobs.append(_read(path))
        if time.perf_counter() - start >= seconds:
            break
    read_time = max(time.perf_counter() - start, 1e-9)
    nbytes = sum(len(b) for b in blobs)
    decoded = errors = 0
    start = time.perf_counter()
    for blob in blobs:
        try:
            with Image.open(io.BytesIO(blob)) as image:
                image.convert("RGB").load()
            decoded += 1
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
            errors += 1
        if time.perf_counter() - start >= seconds:
            break
    decode_time = max(time.perf_counter() - start, 1e-9)
    return {
        "data_dir": data_dir,
        "files": len(blobs),
        "mb": round(nbytes / 1e6, 2),
        "read_mb_per_sec": round(nbytes / 1e6 / read_time, 2),
        "files_per_sec": round(len(blobs) / read_time, 1),
        "jpegs_per_sec": round(decoded / decode_time, 1),
        "decode_errors": errors,
    }
