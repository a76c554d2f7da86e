"""Atomic rank-0 checkpoints: ``checkpoints/step-<9 digits>.pt``, written temp + rename.

A reader never sees a partial file under a final name: the state is written to
``.step-N.pt.tmp-<pid>``, fsynced, then renamed with ``os.replace`` and the directory
fsynced. A crash mid-save leaves only a temp file, which the next save removes.
``save_run``/``restore_run`` put a training run's whole state in and out of one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer import distributed as dist_utils

if TYPE_CHECKING:
    from trainer.engine import Run

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


def save_run(run: Run, batch_in_epoch: int) -> None:
    """Collective: gather every rank's RNG state, rank 0 writes, all wait for it.

    The heartbeat's phase is "checkpoint" meanwhile (a save can take a while), then "train".
    """
    run.heartbeat.progress(phase="checkpoint")
    rng = dist_utils.gather_objects(run.env, dist_utils.rng_state())
    if run.env.is_main:
        path = save_checkpoint(
            checkpoint_dir(Path(run.cfg.output_dir)),
            {
                "model": run.raw_model.state_dict(),
                "optimizer": run.optimizer.state_dict(),
                "scheduler": run.scheduler.state_dict(),
                "scaler": run.scaler.state_dict(),
                "step": run.step,
                "epoch": run.epoch,
                "batch_in_epoch": batch_in_epoch,
                "world_size": run.env.world_size,
                "rng": rng,
                "args": dataclasses.asdict(run.cfg),
            },
            run.cfg.keep_checkpoints,
        )
        LOG.info("checkpoint %s", path)
    dist_utils.barrier(run.env)
    run.heartbeat.progress(phase="train")


def restore_run(run: Run, state: dict) -> int:
    """Load optimizer, schedule, scaler, position and RNG; returns the batch to start at."""
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.scaler.load_state_dict(state["scaler"])
    run.step, run.epoch = int(state["step"]), int(state["epoch"])
    start_batch = int(state.get("batch_in_epoch", 0))
    if state.get("world_size") == run.env.world_size and len(state["rng"]) > run.env.rank:
        dist_utils.set_rng_state(state["rng"][run.env.rank])
    elif start_batch:
        LOG.warning("world size changed since the checkpoint: starting the next epoch")
        run.epoch, start_batch = run.epoch + 1, 0
    LOG.info("resumed from step %d (epoch %d, batch %d)", run.step, run.epoch, start_batch)
    return start_batch
