"""Logging, heartbeat, metrics.jsonl, summary.json and throughput timing."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

LOG = logging.getLogger("trainer")


def write_json_atomic(path: Path, obj: object) -> None:
    """Write JSON to a temp file beside ``path`` and rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=None, sort_keys=True) + "\n")
    os.replace(tmp, path)


def setup_logging(output_dir: Path, rank: int) -> None:
    """Every rank logs to logs/rank-<rank>.log; rank 0 also to stdout (container logs)."""
    log_dir = output_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s")
    handlers: list[logging.Handler] = [logging.FileHandler(log_dir / f"rank-{rank}.log")]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stdout))
    else:
        err = logging.StreamHandler(sys.stderr)
        err.setLevel(logging.ERROR)
        handlers.append(err)
    LOG.handlers.clear()
    for h in handlers:
        h.setFormatter(fmt)
        LOG.addHandler(h)
    LOG.setLevel(logging.INFO)
    LOG.propagate = False


class Heartbeat:
    """heartbeat/rank-<rank>.json = {rank, step, time, pid, host}, replaced atomically."""

    def __init__(self, output_dir: Path, rank: int, host: str):
        self.path = output_dir / "heartbeat" / f"rank-{rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.host, self.pid = rank, host, os.getpid()

    def beat(self, step: int) -> None:
        record = {"rank": self.rank, "step": step, "time": time.time()}
        write_json_atomic(self.path, {**record, "pid": self.pid, "host": self.host})


class MetricsLog:
    """Rank 0's metrics.jsonl: one row per log interval, flushed as written."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        if resume_step is None:
            self.path.write_text("")
        else:  # drop rows from after the checkpoint: they will be logged again
            self._truncate_after(resume_step)

    def _truncate_after(self, step: int) -> None:
        if not self.path.exists():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line)
            except json.JSONDecodeError:
                continue  # a row torn by a crash
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(f"{k}\n" for k in keep))
        os.replace(tmp, self.path)

    def write(self, row: dict[str, object]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")


class Throughput:
    """Images per second over an interval and over the run after ``warmup`` steps."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.steps = 0
        self.interval_start = time.perf_counter()
        self.interval_images = 0
        self.run_start: float | None = None if warmup else time.perf_counter()
        self.run_end = 0.0
        self.run_images = 0

    def step(self, images: int) -> None:
        """Count a finished step of ``images`` images (call once per step, on every rank)."""
        self.steps += 1
        self.interval_images += images
        if self.run_start is not None:
            self.run_images += images
            self.run_end = time.perf_counter()
        elif self.steps >= self.warmup:
            self.run_start = time.perf_counter()

    def interval(self) -> float:
        """Images/s since the last call (resets the interval)."""
        now = time.perf_counter()
        rate = self.interval_images / max(now - self.interval_start, 1e-9)
        self.interval_start, self.interval_images = now, 0
        return rate

    def overall(self) -> float | None:
        """Images/s after warmup; None when the run had no steps past warmup."""
        if self.run_start is None or self.run_images == 0:
            return None
        return self.run_images / max(self.run_end - self.run_start, 1e-9)
