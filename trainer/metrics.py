"""Logging, the heartbeat (a ddpfleet_heartbeat.Beat), metrics.jsonl, throughput.

summary.json is not written here: ``ddpfleet_agent.summary.write_trainer_summary`` writes it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ddpfleet_agent import ddpfleet_heartbeat

LOG = logging.getLogger("trainer")


class NonFiniteError(RuntimeError):
    """The loss or the weights became NaN or infinite at ``step``: the run has diverged."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


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


HEARTBEAT_DIR_ENV = ddpfleet_heartbeat.DIR_ENV
HEARTBEAT_INTERVAL_ENV = "DDPFLEET_HEARTBEAT_INTERVAL"


def heartbeat_dir(output_dir: Path | None) -> Path | None:
    """$DDPFLEET_HEARTBEAT_DIR (the agent's, inside the container), else <output_dir>/heartbeat."""
    chosen = os.environ.get(HEARTBEAT_DIR_ENV)
    if chosen:
        return Path(chosen)
    return None if output_dir is None else output_dir / "heartbeat"


def _period_from_env() -> float:
    """$DDPFLEET_HEARTBEAT_INTERVAL in seconds; 1 when unset or not a positive number."""
    try:
        period = float(os.environ.get(HEARTBEAT_INTERVAL_ENV) or 1.0)
    except ValueError:
        return 1.0
    return period if period > 0 else 1.0


class Heartbeat(ddpfleet_heartbeat.Beat):
    """The trainer's ``rank-<rank>.json``: the heartbeat helper's record and thread (the one
    writer of the format), every ``period`` seconds ($DDPFLEET_HEARTBEAT_INTERVAL, default 1),
    once at ``start`` and once at ``stop``, plus ``local_rank`` and ``host``.

    The training loop only sets fields (``progress``, ``interval``, ``set_total``: no I/O).
    ``time`` is the thread's last write: it goes stale only when the process stops running
    (SIGSTOP, a dead host). ``progress_time`` is the last progress mark: it goes stale when
    the rank waits (for a peer in a collective) while ``time`` stays fresh. ``phase`` is one
    of start, scan (building the data sets), train, validate, checkpoint, done. A failed
    write is logged once and never stops training.
    """

    def __init__(self, rank: int, local_rank: int, host: str, period: float | None = None):
        period = _period_from_env() if period is None else period
        super().__init__(None, rank, 0, period, local_rank=local_rank, host=host, phase="start")
        self._warned = False

    def progress(
        self, step: int | None = None, phase: str | None = None, epoch: int | None = None
    ) -> None:
        """Mark progress now: a batch fetched, a step done, a phase entered (no I/O)."""
        self._update(step=step, phase=phase, epoch=epoch)

    def interval(
        self,
        loss: float,
        images_per_sec: float,
        own: float | None = None,
        sec_per_image: float | None = None,
        step: int | None = None,
    ) -> None:
        """The last log interval's all-reduced loss and total images/s, this rank's images/s
        (``rank_images_per_sec``: the agent's per-host metric) and its own seconds per image,
        waits for peers left out (``sec_per_image``: ``Throughput.sec_per_image``), and the
        ``step`` it ended at (``interval_step``: which interval the agents compare) (no I/O)."""
        self._update(
            progress=False, loss=loss, images_per_sec=images_per_sec, rank_images_per_sec=own,
            interval_step=step,
        )  # fmt: skip
        with self._lock:  # None too: _update would keep the last interval's figure as this one's
            self._rec["sec_per_image"] = sec_per_image

    def saved(self, step: int) -> None:
        """The newest checkpoint is that of ``step``, on the shared storage: the run agents
        let a host that came back rejoin at such a boundary (no I/O)."""
        self._update(progress=False, saved=step)

    def set_total(
        self, total_steps: int, batch: int | None = None, micro: int | None = None
    ) -> None:
        """The run's steps, and this rank's share of the global batch in ``micro`` pieces (the
        agent records them per attempt) (no I/O)."""
        self._update(progress=False, total_steps=total_steps, batch=batch, micro_batches=micro)

    # Not Beat.start's argument (the heartbeat's directory): the run's output directory.
    def start(self, output_dir: Path | None = None) -> Heartbeat:  # type: ignore[override]
        """Write the first record and start the thread, in ``heartbeat_dir(output_dir)``.

        Does nothing when already started, or without a directory (no agent, no output dir).
        """
        super().start(heartbeat_dir(output_dir))
        return self

    def on_write_error(self, error: OSError) -> None:
        if not self._warned:
            LOG.warning("heartbeat %s not written: %s", self.path, error)
            self._warned = True


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
    """Training images per second over an interval and over the run after ``warmup`` steps.

    Time spent in ``paused()`` (validation) counts in neither: on one H100 the first
    validation of a 16-step epoch took 11 s of cuDNN autotuning for its shapes, which cut
    the run's figure from ~3,000 to 856 img/s although no training step was slower."""

    def __init__(self, warmup: int, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock  # seconds; the tests pass their own
        self.warmup = warmup
        self.steps = 0
        self.interval_start = self.clock()
        self.interval_images = 0
        self.interval_wait = 0.0
        self.wait_fraction = 0.0  # the last interval's share of time spent waiting for data
        self.last_wait, self.last_images = 0.0, 0  # the last interval's, for sec_per_image
        self.run_start: float | None = None if warmup else self.clock()
        self.run_end = 0.0
        self.run_images = 0

    def step(self, images: int) -> None:
        """Count a finished step of ``images`` images (call once per step, on every rank)."""
        self.steps += 1
        self.interval_images += images
        if self.run_start is not None:
            self.run_images += images
            self.run_end = self.clock()
        elif self.steps >= self.warmup:
            self.run_start = self.clock()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the time inside out of both rates."""
        began = self.clock()
        try:
            yield
        finally:
            spent = self.clock() - began
            self.interval_start += spent
            if self.run_start is not None:  # both ends: a pause after the last step is no step
                self.run_start += spent
                self.run_end += spent

    def waited(self, seconds: float) -> None:
        """Count time spent waiting for the next batch (the data loader)."""
        self.interval_wait += seconds

    def interval(self) -> float:
        """Images/s since the last call (resets the interval; sets ``wait_fraction``)."""
        now = self.clock()
        spent = max(now - self.interval_start, 1e-9)
        rate = self.interval_images / spent
        self.wait_fraction = min(self.interval_wait / spent, 1.0)
        self.last_wait, self.last_images = self.interval_wait, self.interval_images
        self.interval_start, self.interval_images, self.interval_wait = now, 0, 0.0
        return rate

    def sec_per_image(self, forward: float) -> float | None:
        """This rank's own seconds per image over the last interval: its data wait plus 3 x
        ``forward`` (its forward seconds; the backward taken as twice the forward, since DDP's
        all-reduce overlaps the backward and would count the wait for slower peers), over its
        images; None without images. 6 significant digits."""
        if self.last_images <= 0:
            return None
        return float(f"{(self.last_wait + 3 * forward) / self.last_images:.6g}")

    def overall(self) -> float | None:
        """Images/s after warmup; None when the run had no steps past warmup."""
        if self.run_start is None or self.run_images == 0:
            return None
        return self.run_images / max(self.run_end - self.run_start, 1e-9)


class ForwardTimer:
    """This rank's forward seconds (model and criterion) over a log interval: perf_counter on
    the CPU; on CUDA, a pair of timing events per forward, read only by ``seconds`` (no device
    sync per step). The forward has no collective (wrap_ddp syncs no buffers), so no peer's
    pace is in it."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def timed(self, device: torch.device) -> Iterator[None]:
        """Count the time inside as forward time on ``device``."""
        if device.type != "cuda":
            began = time.perf_counter()
            yield
            self.spent += time.perf_counter() - began
            return
        stream = torch.cuda.current_stream(device)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        yield
        end.record(stream)
        self.events.append((begin, end))

    def seconds(self) -> float:
        """Forward seconds since the last call (resets). Waits for the last event only: call
        it after the interval's all-reduce, when the device has caught up anyway."""
        spent, events = self.spent, self.events
        self.spent, self.events = 0.0, []
        if events:
            events[-1][1].synchronize()
            spent += sum(begin.elapsed_time(end) for begin, end in events) / 1000  # ms
        return spent
