"""The way back of a host left out as too slow for a share (regrow.py): doctor's compute check
of the run's model, in place, before it asks to come back.

The first check runs as the host is left out: its figure is the host's slow pace. The host asks
to come back once a check gives ``stragglers.GAIN`` times that, or a third of the images/s the
median host did in the run as it was left out (``stragglers.wanted``: the first check itself
may pass that, where the slowdown ended before it; not within ``stragglers.PAR_AGAIN`` of
the host's last pass on it alone: ``par_from``, failover.py; the detector gives the host a share
proportional to its speed from there, or leaves it out again); one that cannot finish within
``TIMEOUT`` counts as still slow, and one that fails or cannot run lets the host ask as any host
left out does (the line says why). The check runs in the host's run container: it gets what
the ranks got, the host's GPUs or its CPU quota.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from ddpfleet_agent.stragglers import wanted

EVERY = 30.0  # seconds from one check's end to the next one's start
TIMEOUT = 600.0  # a check running longer is ended: the host is still too slow
# the trainer's flags the check takes from the run's command line, as the trainer reads them
FLAGS = ("--arch", "--image-size", "--amp")


def check_command(command: list[str]) -> list[str]:
    """doctor's compute check of the run's model (``--arch``, ``--image-size``, ``--amp``,
    channels_last as the trainer's command line gives them), short: a few timed steps."""
    check = [sys.executable, "-m", "ddpfleet_doctor", "compute", "--seconds=4", "--warmup=2"]
    check += [f"{f}={command[i + 1]}" for i, f in enumerate(command[:-1]) if f in FLAGS]
    return check + (["--no-channels-last"] if "--no-channels-last" in command else [])


def figure(code: int | None, out: str, err: str) -> float | str:
    """A finished check's images/s, or why it has none (one line)."""
    if code == 0:
        with contextlib.suppress(IndexError, KeyError, TypeError, ValueError):
            return float(json.loads(out.strip().splitlines()[-1])["images_per_sec"])
    return (err.strip().splitlines() or [f"exit code {code}"])[-1][:200]


class Gate:
    """``passed(now)``: True once a check says the host is fast again; it starts the checks
    (one at a time, EVERY s apart) and reads their figures without waiting for them."""

    def __init__(
        self,
        command: list[str],
        say: Callable[[str], None],
        par: float | None = None,
        par_from: float = 0.0,
    ) -> None:
        self.command, self.say = command, say
        self.par, self.par_from = par, par_from  # stragglers.wanted's par, from that time on
        self.first: float | None = None  # the figure as it was left out (0: no check finished)
        self.on_par = False  # it passed on par, not on its own first figure
        self.proc: subprocess.Popen | None = None
        self.files = Path(tempfile.mkdtemp(prefix="ddpfleet-check-"))  # its stdout and stderr
        self.started = self.due = 0.0
        self.open = False

    def passed(self, now: float) -> bool:
        if self.open:
            return True
        if self.proc is None:
            if now >= self.due:
                self._start(now)
            return False
        if self.proc.poll() is None and now - self.started < TIMEOUT:
            return False
        self._read(now)
        return self.open

    def _start(self, now: float) -> None:
        out, err = self.files / "out", self.files / "err"
        try:
            with out.open("wb") as stdout, err.open("wb") as stderr:
                self.proc = subprocess.Popen(self.command, stdout=stdout, stderr=stderr)
        except OSError as exc:
            self.say(f"doctor's compute check cannot run ({exc}): it asks to come back")
            self.open = True
            return
        self.started = now

    def _read(self, now: float) -> None:
        proc, self.proc = self.proc, None
        assert proc is not None
        if proc.poll() is None:
            self._end(proc)
            got: float | str = 0.0
            self.say(f"doctor's compute check did not finish in {TIMEOUT:.0f}s: still too slow")
        else:
            texts = [(self.files / n).read_text(errors="replace") for n in ("out", "err")]
            got = figure(proc.returncode, *texts)
        self.due = now + EVERY
        if isinstance(got, str):  # it failed: the host cannot tell its speed this way
            self.say(f"doctor's compute check failed ({got}): it asks to come back")
            self.open = True
            return
        first = self.first is None
        if first:
            self.first = got
        if not got:  # too slow to finish one: any check that finishes will do
            return
        par = self.par if now >= self.par_from else None
        own, want = wanted(self.first or 0.0, None), wanted(self.first or 0.0, par)
        self.open = got >= want
        self.on_par = self.open and got < own  # on par alone, not on its own first figure
        what = "it asks to come back" if self.open else "still too slow"
        if not first:
            line = f"{got:g} img/s, {want:.4g} asked: {what}"
        elif self.open:  # as fast as that already: its slowdown ended before this check
            line = f"{got:g} img/s as it was left out, {want:.4g} asked (a third of the median "
            line += f"host's pace in the run): {what}"
        else:
            line = f"{got:g} img/s as it was left out; it asks to come back at {want:.4g} img/s"
        self.say(f"doctor's compute check: {line}")

    @staticmethod
    def _end(proc: subprocess.Popen) -> None:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def close(self) -> None:
        """End a check still running (the host is back, or its agent ends)."""
        if self.proc is not None:
            self._end(self.proc)
            self.proc = None
        shutil.rmtree(self.files, ignore_errors=True)
