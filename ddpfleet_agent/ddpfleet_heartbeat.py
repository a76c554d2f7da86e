"""Live progress and stall detection for your own program under ddpfleet's run agent.

Standard library only: train.yml puts this file on a user program's PYTHONPATH; copy it to
use it elsewhere. Outside a ddpfleet run ($DDPFLEET_HEARTBEAT_DIR unset) every call does nothing.

    import ddpfleet_heartbeat as hb

    beat = hb.start(total_steps=len(loader) * epochs)  # a thread writes about once a second
    for step, batch in enumerate(loader, 1):
        ...
        beat.step(step, loss=loss.item(), images_per_sec=rate)  # no I/O
    beat.phase("validate")  # a long phase without steps is progress too
    beat.stop()  # phase "done"

The agent judges a rank frozen when ``time`` is older than train_heartbeat_timeout (SIGSTOP, a
dead GPU), hung when ``progress_time`` is, in phase "train" or "validate". The file, to write it
without this module: ``$DDPFLEET_HEARTBEAT_DIR/rank-<RANK>.json``, replaced atomically (a
temporary file in the same directory, then rename), a JSON object with ``rank`` (int, the
global rank), ``time`` and ``progress_time`` (Unix seconds), and optionally ``step``,
``total_steps``, ``epoch``, ``phase`` (start, train, validate, checkpoint or done), ``loss``
and ``images_per_sec`` (shown in train.yml's progress lines). ddpfleet's trainer subclasses
``Beat`` (trainer.metrics.Heartbeat).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

DIR_ENV = "DDPFLEET_HEARTBEAT_DIR"


class Beat:
    """One rank's heartbeat file, rewritten by a daemon thread every ``period`` seconds.
    ``directory`` None: ``start`` may give it, else nothing is written. ``fields``: more fields
    for the record, or first values of its own (``phase="start"``)."""

    def __init__(self, directory: str | None, rank: int, total_steps: int = 0,
                 period: float = 1.0, **fields: object):  # fmt: skip
        self.path = None if not directory else os.path.join(directory, f"rank-{rank}.json")
        self.period = period
        now = time.time()
        self._rec = {"rank": rank, "pid": os.getpid(), "time": now, "progress_time": now,
                     "step": 0, "total_steps": total_steps, "epoch": 0, "phase": "train",
                     "loss": None, "images_per_sec": None, **fields}  # fmt: skip
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self, step: int, loss: float | None = None, images_per_sec: float | None = None,
             epoch: int | None = None) -> None:  # fmt: skip
        """A step finished: progress now (no I/O)."""
        self._update(step=step, loss=loss, images_per_sec=images_per_sec, epoch=epoch)

    def phase(self, name: str) -> None:
        """Entering a phase (train, validate, checkpoint): progress now (no I/O)."""
        self._update(phase=name)

    def _update(self, progress: bool = True, **fields: object) -> None:
        with self._lock:
            self._rec.update({k: v for k, v in fields.items() if v is not None})
            if progress:
                self._rec["progress_time"] = time.time()

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {**self._rec, "time": time.time()}

    def on_write_error(self, error: OSError) -> None:
        """A write failed (a full disk): override to report it. The program goes on either
        way; the agent notices a stale heartbeat."""

    def _write(self) -> None:
        if self.path is None:
            return
        tmp = f"{self.path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.snapshot(), fh)
            os.replace(tmp, self.path)
        except OSError as exc:  # a full disk must not kill training
            self.on_write_error(exc)

    def _run(self) -> None:
        while not self._done.wait(self.period):
            self._write()

    def start(self, directory: str | os.PathLike[str] | None = None) -> Beat:
        """Write the first record and start the thread, in ``directory`` if given (created if
        missing), else the constructor's. Does nothing when started, or with neither."""
        if self._thread is None and directory is not None:
            self.path = os.path.join(directory, f"rank-{self._rec['rank']}.json")
        if self._thread is None and self.path is not None:
            with contextlib.suppress(OSError):  # the first write reports it
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._write()
            self._thread = threading.Thread(
                target=self._run, name="ddpfleet-heartbeat", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Write phase "done" and stop the thread."""
        if self._thread is not None:
            self._done.set()
            self._thread.join()
            self._update(phase="done")
            self._write()


def start(total_steps: int = 0, rank: int | None = None, period: float = 1.0) -> Beat:
    """Start this process's heartbeat (rank: $RANK from torchrun unless given)."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    return Beat(os.environ.get(DIR_ENV), rank, total_steps, period).start()
