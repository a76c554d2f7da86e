"""Atomic rank-0 checkpoints: ``checkpoints/step-<9 digits>.pt``, written temp + rename.

A reader never sees a partial file under a final name: the state is written to
``.step-N.pt.tmp-<pid>``, fsynced, then renamed with ``os.replace`` and the directory
fsynced. A crash mid-save leaves only a temp file, which the next save removes.
``save_run``/``restore_run`` put a training run's whole state in and out of one.

"Newest" means most recently written, not highest step: ``checkpoints/order.json`` lists the
kept checkpoints newest first (rank 0 rewrites it atomically after each save; a run that
resumes from a checkpoint puts that one first). Pruning keeps the first ``keep`` of that
order, and ``--resume auto`` takes the first readable one, so a run resumed from an older
step (or started over) never loses its new checkpoints to higher-numbered old ones.
Checkpoints the order does not list (written before it existed, or copied in) count as
older than the listed ones, highest step first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ddpfleet_agent.files import write_json_atomic
from ddpfleet_agent.summary import SUMMARY, TRAINER_PART
from trainer import distributed as dist_utils
from trainer.metrics import NonFiniteError

if TYPE_CHECKING:
    from trainer.engine import Run

LOG = logging.getLogger("trainer")
NAME = re.compile(r"^step-(\d{9})\.pt$")
ORDER = "order.json"
REQUIRED = ("model", "optimizer", "scheduler", "scaler", "step", "epoch", "rng", "args")


class CheckpointError(Exception):
    """A checkpoint that cannot be used (missing, truncated, not ours)."""


def checkpoint_dir(output_dir: Path) -> Path:
    return output_dir / "checkpoints"


def _read_order(directory: Path) -> list[str]:
    """The names in ``order.json``, newest first ([] when missing or damaged)."""
    try:
        names = json.loads((directory / ORDER).read_text()).get("newest_first", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _write_order(directory: Path, paths: list[Path]) -> None:
    write_json_atomic(directory / ORDER, {"newest_first": [p.name for p in paths]}, indent=None)


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of complete checkpoints, newest written first (see the module doc)."""
    if not directory.is_dir():
        return []
    found = {p.name: (int(m.group(1)), p) for p in directory.iterdir() if (m := NAME.match(p.name))}
    listed = [found.pop(name) for name in dict.fromkeys(_read_order(directory)) if name in found]
    return listed + sorted(found.values(), reverse=True)


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
    order = [final, *(p for _, p in list_checkpoints(directory) if p != final)]
    _write_order(directory, order[:keep])  # before pruning: a crash leaves extras, not gaps
    for old in order[keep:]:
        old.unlink(missing_ok=True)
    return final


def put_first(path: Path) -> None:
    """Make ``path`` (a checkpoint in its directory) the newest: a run resumed from it."""
    others = [p for _, p in list_checkpoints(path.parent) if p != path]
    _write_order(path.parent, [path, *others])


def archive_run(output_dir: Path) -> Path | None:
    """Move the checkpoints, metrics.jsonl, summary.json and the trainer's part of it (left
    where no agent took it: an agent that died) aside, into ``archive/<UTC time>/``; None when
    there is nothing to move."""
    directory = checkpoint_dir(output_dir)
    moving = [p for _, p in list_checkpoints(directory)]
    if (directory / ORDER).exists():
        moving.append(directory / ORDER)
    records = [output_dir / n for n in ("metrics.jsonl", SUMMARY, TRAINER_PART)]
    records = [p for p in records if p.exists()]
    if not moving and not records:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = output_dir / "archive" / stamp
    n = 1
    while target.exists():
        n += 1
        target = output_dir / "archive" / f"{stamp}-{n}"
    (target / "checkpoints").mkdir(parents=True)
    for path in moving:
        os.replace(path, target / "checkpoints" / path.name)
    for path in records:
        os.replace(path, target / path.name)
    return target


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


def find_latest(directory: Path, skipped: list[str] | None = None) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads; each damaged newer one's error goes to ``skipped``.

    None when there is none at all; CheckpointError when there are some but none loads.
    """
    errors = [] if skipped is None else skipped
    for _, path in list_checkpoints(directory):
        try:
            return path, load_checkpoint(path)
        except CheckpointError as exc:
            errors.append(str(exc))
    if errors:
        more = f" and {len(errors) - 1} older one(s)" if len(errors) > 1 else ""
        raise CheckpointError(f"no readable checkpoint in {directory}: {errors[0]}{more}")
    return None


def _finite(module: torch.nn.Module) -> bool:
    """Whether every floating parameter and buffer is finite (one device sync)."""
    tensors = [t for t in module.state_dict().values() if t.is_floating_point()]
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all().item())


def save_run(run: Run, batch_in_epoch: int) -> None:
    """Collective: gather every rank's RNG state, rank 0 writes, all wait for it.

    Weights that are no longer finite are never saved: every rank checks its own (riding on
    the RNG gather) and all raise NonFiniteError, so the last good checkpoint stays the
    newest. The heartbeat's phase is "checkpoint" meanwhile, then "train".
    """
    run.heartbeat.progress(phase="checkpoint")
    gathered = dist_utils.gather_objects(run.env, (dist_utils.rng_state(), _finite(run.raw_model)))
    rng = [r for r, _ in gathered]
    if not all(ok for _, ok in gathered):  # every rank sees the same flags: all raise
        raise NonFiniteError(
            f"parameters became non-finite by step {run.step} (no checkpoint written)", run.step
        )
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
                "global_batch": run.global_batch,
                "rng": rng,
                "args": dataclasses.asdict(run.cfg),
            },
            run.cfg.keep_checkpoints,
        )
        LOG.info("checkpoint %s", path)
    dist_utils.barrier(run.env)
    run.heartbeat.saved(run.step)
    run.heartbeat.progress(phase="train")


def restore_run(run: Run, state: dict) -> int:
    """Load optimizer, schedule, scaler, position and RNG; returns the batch to start at.
    At another world size the ranks' RNG states do not carry over; the epoch goes on where it
    was when the global batch is the same (step s takes the same images at any world size:
    trainer.balance's sampler), else from the next epoch."""
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.scaler.load_state_dict(state["scaler"])
    run.step, run.epoch = int(state["step"]), int(state["epoch"])
    start_batch = int(state.get("batch_in_epoch", 0))
    if state.get("world_size") == run.env.world_size and len(state["rng"]) > run.env.rank:
        dist_utils.set_rng_state(state["rng"][run.env.rank])
    elif start_batch and state.get("global_batch") != run.global_batch:
        LOG.warning("global batch changed since the checkpoint: starting the next epoch")
        run.epoch, start_batch = run.epoch + 1, 0
    LOG.info("resumed from step %d (epoch %d, batch %d)", run.step, run.epoch, start_batch)
    return start_batch
