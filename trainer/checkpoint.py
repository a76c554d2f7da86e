"""Atomic rank-0 checkpoints: ``checkpoints/step-<9 digits>.pt``, written temp + rename.

A reader never sees a partial file under a final name: the state is written to
``.step-N.pt.tmp-<pid>``, fsynced, then renamed with ``os.replace`` and the directory
fsynced. A crash mid-save leaves only a temp file, which the next save removes.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

LOG = logging.getLogger("trainer")
NAME = re.compile(r"^step-(\d{9})\.pt$")
REQUIRED = ("model", "optimizer", "scheduler", "scaler", "step", "epoch", "rng", "args")


class CheckpointError(Exception):
    """A checkpoint that cannot be used (missing, truncated, not ours)."""


def checkpoint_dir(output_dir: Path) -> Path:
    return output_dir / "checkpoints"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of complete checkpoints, newest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := NAME.match(p.name))]
    return sorted(found, reverse=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory: Path, state: dict[str, object], keep: int) -> Path:
    """Write ``state`` for ``state['step']`` atomically; keep the newest ``keep`` files."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(".step-*.pt.tmp-*"):
        stale.unlink(missing_ok=True)  # left by a save that was killed
    final = directory / f"step-{int(state['step']):09d}.pt"  # type: ignore[call-overload]
    tmp = directory / f".{final.name}.tmp-{os.getpid()}"
    with tmp.open("wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(directory)
    for _, old in list_checkpoints(directory)[keep:]:
        old.unlink(missing_ok=True)
    return final


def load_checkpoint(path: Path) -> dict[str, object]:
    """Load to CPU with the safe (weights-only) unpickler; CheckpointError if unusable."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except Exception as exc:  # torch raises many types for a damaged file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint ({first[:120]})") from None
    missing = [k for k in REQUIRED if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{path}: not a trainer checkpoint (missing {', '.join(missing)})")
    return state


def find_latest(directory: Path) -> tuple[Path, dict[str, object]] | None:
    """The newest checkpoint that loads; damaged newer ones are skipped with a warning."""
    for _, path in list_checkpoints(directory):
        try:
            return path, load_checkpoint(path)
        except CheckpointError as exc:
            LOG.warning("skipping checkpoint: %s", exc)
    return None
