"""Which checkpoint a run starts from (``--resume {auto,never,archive,PATH}``): rank 0
chooses for every rank (or refuses), every rank loads that one file, and once the input is
valid rank 0 records the start (moves the old run aside, or makes the resumed checkpoint the
newest). See trainer.checkpoint for what "newest" means.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ddpfleet_agent.restarts import FULL_WORLD_ENV, KEPT_RANKS_ENV, RESTART_ENV, WEIGHTS_ENV
from trainer import checkpoint as ckpt
from trainer import distributed as dist_utils
from trainer.balance import parse_weights
from trainer.config import BadInputError, TrainConfig
from trainer.metrics import LOG


def restarted(cfg: TrainConfig) -> TrainConfig:
    """A run its agents restarted in place (``$DDPFLEET_RESTART`` > 0) goes on from its newest
    checkpoint, whatever ``--resume`` said at its first start (never, archive, a path)."""
    count = os.environ.get(RESTART_ENV, "")
    if count.isdigit() and int(count) > 0 and cfg.resume != "auto":
        return dataclasses.replace(cfg, resume="auto")
    return cfg


def shrunk_world() -> tuple[int, list[int] | None]:
    """(the first attempt's world size, its global ranks that remain) of a run its agents
    restarted without a host that is gone; (0, None) for a run at its full size."""
    full, kept = os.environ.get(FULL_WORLD_ENV, ""), os.environ.get(KEPT_RANKS_ENV, "")
    try:
        return int(full), [int(r) for r in kept.split(",")]
    except ValueError:
        if full or kept:
            raise BadInputError(
                f"${FULL_WORLD_ENV} {full!r} / ${KEPT_RANKS_ENV} {kept!r}"
            ) from None
        return 0, None


def rebalanced_weights() -> list[float] | None:
    """The agents' weights per global rank of the first world after a rebalance
    (``$DDPFLEET_BATCH_WEIGHTS``, for trainer.balance.attempt_batches); None when unset or
    empty. BadInputError naming the variable for a value that is no positive number."""
    return parse_weights(os.environ.get(WEIGHTS_ENV, ""), f"${WEIGHTS_ENV}")


def _choose(cfg: TrainConfig) -> tuple[dict[str, object], dict | None]:
    """Rank 0: the resume plan ``{path, skipped, error}`` and the state it loaded (if any)."""
    directory = ckpt.checkpoint_dir(Path(cfg.output_dir))
    skipped: list[str] = []
    plan: dict[str, object] = {"path": None, "skipped": skipped, "error": None}
    if cfg.resume == "archive":
        return plan, None
    if cfg.resume == "never":
        existing = ckpt.list_checkpoints(directory)
        if existing:
            plan["error"] = (
                f"--resume never: {directory} has {len(existing)} checkpoint(s) "
                f"(newest {existing[0][1].name}); continue with --resume auto, or start over "
                f"with --resume archive (moves them to {Path(cfg.output_dir) / 'archive'})"
            )
        return plan, None
    try:
        if cfg.resume == "auto":
            found = ckpt.find_latest(directory, skipped)
            if found is None:
                return plan, None
            plan["path"] = str(found[0])
            return plan, found[1]
        plan["path"] = cfg.resume
        return plan, ckpt.load_checkpoint(Path(cfg.resume))
    except ckpt.CheckpointError as exc:
        hint = "; fix or remove them, or start over with --resume archive"
        plan["error"] = f"--resume {exc}" if cfg.resume != "auto" else f"--resume auto: {exc}{hint}"
        return plan, None


def resume_state(cfg: TrainConfig, env: dist_utils.DistEnv) -> tuple[dict | None, dict]:
    """Collective: rank 0 chooses the checkpoint (or refuses) and every rank loads that one.

    Nothing is written: a refusal (BadInputError on every rank alike) leaves the checkpoints
    and metrics.jsonl as they were.
    """
    plan, state = _choose(cfg) if env.is_main else (None, None)
    plan = dist_utils.gather_objects(env, plan)[0]  # rank 0's plan, on every rank
    if plan["error"]:
        raise BadInputError(str(plan["error"]))
    if plan["path"] is None:
        return None, plan
    error = None
    if not env.is_main:
        try:
            state = ckpt.load_checkpoint(Path(str(plan["path"])))
        except ckpt.CheckpointError as exc:
            error = f"rank {env.rank} cannot read the checkpoint rank 0 chose: {exc}"
    errors = [e for e in dist_utils.gather_objects(env, error) if e]
    if errors:
        raise BadInputError(str(errors[0]))
    return state, plan


def start_records(cfg: TrainConfig, plan: dict) -> None:
    """Rank 0, once everything is validated: move the old run aside (--resume archive) or
    make the resumed checkpoint the newest, and say which unreadable ones were skipped."""
    out = Path(cfg.output_dir)
    for error in plan["skipped"]:
        LOG.warning("skipped an unreadable checkpoint: %s", error)
    if cfg.resume == "archive":
        moved = ckpt.archive_run(out)
        if moved is not None:
            LOG.info("moved the previous checkpoints, metrics and summary to %s", moved)
    elif plan["path"] is not None:
        path = Path(str(plan["path"]))
        if path.parent.resolve() == ckpt.checkpoint_dir(out).resolve():
            ckpt.put_first(path)
    if plan["path"] is not None:
        LOG.info("resuming from %s", plan["path"])
