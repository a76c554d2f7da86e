"""This host's ranks: the supervised command, its output, its heartbeats, its processes."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import DEVNULL, PIPE, STDOUT
from typing import IO

from ddpfleet_agent.awake import Awake

FROZEN_AFTER = 5.0  # a heartbeat thread silent this long means the process is not running
KILL_WAIT = 10.0  # seconds kill_all waits for the killed command to be reaped
_ROOT_CAUSE_RE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(-?\d+)\s*\(local_rank:\s*(-?\d+)\)"
    r"\s*exitcode\s*:\s*(-?\d+)",
    re.S,
)


def exit_signal(code: int | None) -> int | None:
    """The signal of an exit code (Popen's -signal, a shell's 128+signal), or None."""
    if code is None or not (code < 0 or code > 128):
        return None
    return -code if code < 0 else code - 128


def describe_exit(code: int) -> str:
    num = exit_signal(code)
    if num is not None:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(num).name} (exit code {code})"
    return f"exited with code {code}"


def parents() -> dict[int, int]:
    """pid -> parent pid of every process, from one scan of /proc."""
    found: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = Path(f"/proc/{name}/stat").read_text()
                    found[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def children(pid: int) -> list[int]:
    return [child for child, parent in parents().items() if parent == pid]


def descendants(pid: int) -> list[int]:
    """Every process below pid, parents before children (one scan of /proc)."""
    below: dict[int, list[int]] = {}
    for child, parent in parents().items():
        below.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in below.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def read_heartbeats(directory: Path) -> dict[int, dict]:
    """rank -> heartbeat record, for every readable rank-N.json in directory."""
    beats: dict[int, dict] = {}
    with contextlib.suppress(OSError):
        for path in directory.glob("rank-*.json"):
            with contextlib.suppress(OSError, ValueError):
                rec = json.loads(path.read_text())
                if isinstance(rec, dict) and type(rec.get("rank")) is int:
                    beats[rec["rank"]] = rec
    return beats


def number(value: object) -> float | None:
    """value if it is an int or float (not a bool), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def finite(value: object) -> float | None:
    """value as a float if it is a finite number (not a bool), else None."""
    n = number(value)
    return float(n) if n is not None and math.isfinite(n) else None


# A rank's view of its heartbeat besides rank and phase: counts (0 unless a finite number) and
# numbers (None unless one). batch: its share of the global batch; saved: the newest checkpoint's
# step; sec_per_image: for stragglers.py; interval_step: the step of the last log interval.
COUNTS = ("step", "total_steps", "interval_step")
NUMBERS = ("epoch", "loss", "images_per_sec", "batch", "micro_batches", "saved", "sec_per_image")


def rank_views(
    beats: dict[int, dict], now: float, asleep: Callable[[float, float], float] | None = None
) -> list[dict]:
    """What the store carries per rank, ages on this host's clock, less the time ``asleep(since,
    now)`` says this agent was paused (awake.py). Numbers only where numbers go (a user's
    program writes its own heartbeat): the agents ignore other shapes (wire.SHAPES)."""

    def age(since: float | None) -> float | None:
        if since is None:
            return None
        return round(now - since - (asleep(since, now) if asleep else 0.0), 2)

    views = []
    for rank, rec in sorted(beats.items()):
        live = number(rec.get("time"))
        prog = number(rec.get("progress_time", live))
        views.append(
            {
                "rank": rank,
                "phase": str(rec.get("phase") or "start"),
                "live_age": age(live),
                "progress_age": age(prog),
                **{key: int(finite(rec.get(key)) or 0) for key in COUNTS},
                **{key: number(rec.get(key)) for key in NUMBERS},
            }
        )
    return views


class LocalRanks:
    """Runs the command in its own session and reports on it; never blocks the caller."""

    def __init__(self, heartbeat_dir: Path, sink: Callable[[str], None]):
        self.heartbeat_dir = heartbeat_dir
        self.sink = sink
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.tail: list[str] = []
        self.beats: dict[int, dict] = {}  # as the last record() read them
        self._pump: threading.Thread | None = None
        self.signalled: set[int] = set()  # the rank processes signal_ranks signalled
        self.awake = Awake()  # this agent's own pauses, left out of its ranks' ages

    def start(self, command: list[str], env: dict[str, str]) -> None:
        self.heartbeat_dir.mkdir(parents=True, exist_ok=True)
        env = {**env, "DDPFLEET_HEARTBEAT_DIR": str(self.heartbeat_dir)}
        self.started, self.signalled = time.time(), set()
        self.awake.start()
        self.proc = subprocess.Popen(
            command, stdout=PIPE, stderr=STDOUT, stdin=DEVNULL, env=env, start_new_session=True
        )
        self._pump = threading.Thread(target=self._copy, args=(self.proc.stdout,), daemon=True)
        self._pump.start()

    def _copy(self, out: IO[bytes]) -> None:
        for raw in iter(out.readline, b""):
            line = raw.decode("utf-8", "replace")
            self.tail = ([*self.tail, line.rstrip("\n")])[-400:]
            print(line, end="", flush=True)
            self.sink(line)

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait_output(self, timeout: float = 5.0) -> None:
        """Let the pump drain what the command printed last (its root-cause block)."""
        if self._pump is not None:
            self._pump.join(timeout)

    def end(self) -> None:
        """Kill the command (kill_all) and let the pump drain what it printed last."""
        self.kill_all()
        self.wait_output()

    def heartbeats(self) -> dict[int, dict]:
        return read_heartbeats(self.heartbeat_dir)

    def views(self, now: float) -> list[dict]:
        """The ranks' views now, their ages over the time this agent was awake."""
        return rank_views(self.heartbeats(), now, self.awake.asleep)

    def record(self, state: str) -> dict:
        """This host's record for the store (``beats``: the heartbeats, for the metrics)."""
        self.beats = self.heartbeats()
        return {"state": state, "ranks": rank_views(self.beats, time.time(), self.awake.asleep)}

    def rank_pids(self) -> list[int]:
        """The rank processes: the command's direct children (torchrun's workers)."""
        return [] if self.proc is None else children(self.proc.pid)

    def signal_ranks(self, signum: int) -> list[int]:
        """Signal each rank process (not their groups: loader workers are the rank's business)
        not signalled yet in this start: the first call signals every rank there, a later one
        those the command started since (torchrun starts them after its rendezvous)."""
        pids = [pid for pid in self.rank_pids() if pid not in self.signalled]
        _signal(pids, signum)
        self.signalled.update(pids)
        return pids

    def kill_all(self) -> None:
        """SIGKILL the command's whole tree (frozen processes too), then reap it. The tree is
        stopped first, until a scan finds nothing new: a process still forking leaves no child."""
        if self.proc is None or self.proc.poll() is not None:
            return
        tree: list[int] = [self.proc.pid]
        while True:
            _signal(tree, signal.SIGSTOP)
            found = [self.proc.pid, *descendants(self.proc.pid)]
            if set(found) <= set(tree):
                break
            tree = list(dict.fromkeys([*tree, *found]))
        _signal(tree, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=KILL_WAIT)

    def failed_rank(self, code: int) -> tuple[int | None, int, str]:
        """(rank, exit code, reason) of a non-zero exit, from torchrun's last root-cause block."""
        found = list(_ROOT_CAUSE_RE.finditer("\n".join(self.tail)))
        if found:
            rank, code = int(found[-1].group(1)), int(found[-1].group(3))
        else:
            beats = self.heartbeats()
            rank = next(iter(beats)) if len(beats) == 1 else None  # this host's one rank
        return rank, code, f"{'launcher' if rank is None else f'rank {rank}'} {describe_exit(code)}"
