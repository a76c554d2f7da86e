"""The agent's own pauses (awake.py) and what they take out of its ranks' ages (ranks.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from fake_clock import Clock

from ddpfleet_agent import awake as awake_module
from ddpfleet_agent.awake import Awake, paused_within
from ddpfleet_agent.failures import rank_problem
from ddpfleet_agent.ranks import rank_views

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


@pytest.mark.parametrize(
    ("pauses", "expected"),
    [
        ([], 0.0),
        ([(100.0, 110.0)], 10.0),  # wholly within
        ([(90.0, 105.0)], 10.0),  # began before the window
        ([(115.0, 130.0)], 5.0),  # ends after it
        ([(80.0, 95.0), (125.0, 140.0)], 0.0),  # both outside
        ([(100.0, 110.0), (105.0, 112.0)], 12.0),  # overlapping (noted, and a wake not yet)
        ([(104.0, 106.0), (100.0, 110.0)], 10.0),  # one inside another, in any order
        ([(101.0, 102.0), (110.0, 113.0)], 4.0),  # two apart
    ],
)
def test_paused_within_counts_each_second_of_the_window_once(pauses, expected):
    assert paused_within(pauses, 95.0, 120.0) == pytest.approx(expected)


def test_a_rank_s_silence_leaves_out_the_agent_s_own_pause():
    """A rank silent for 12 s of which its agent slept 10 (stopped together, as in a paused
    VM) is 2 s silent: not frozen at a 4 s heartbeat timeout. Awake the whole time, frozen."""
    now = 1000.0
    beats = {3: {"time": now - 12, "progress_time": now - 12.5, "phase": "train", "step": 7}}
    paused = rank_views(beats, now, lambda since, until: paused_within([(990, 1000)], since, until))
    assert (paused[0]["live_age"], paused[0]["progress_age"]) == (2.0, 2.5)
    assert rank_problem(paused, 4, 5) is None
    awake = rank_views(beats, now)
    assert awake[0]["live_age"] == 12.0
    assert rank_problem(awake, 4, 5) == (3, "rank 3 frozen (no heartbeat for 12s at step 7, "
                                            "phase train)")  # fmt: skip


def test_an_agent_not_started_counts_no_pause():
    awake = Awake(tick=0.01, paused=0.05)
    time.sleep(0.1)  # no watcher: the late "wake" is no pause
    assert awake.asleep(time.time() - 1, time.time()) == 0.0


# A process that watches its own pauses (Awake) and prints how long it slept in the last
# WINDOW s, once the line "ask" comes on stdin.
WATCHED = """
import sys, time
from ddpfleet_agent.awake import Awake
awake = Awake()
awake.start()
print("ready", flush=True)
sys.stdin.readline()
now = time.time()
print(round(awake.asleep(now - float(sys.argv[1]), now), 2), flush=True)
"""


@pytest.mark.parametrize("stopped", [0.0, 3.0])
def test_a_process_stopped_and_continued_finds_its_pause(stopped):
    """SIGSTOP, then SIGCONT ``stopped`` s later, as a paused container or VM: the process
    finds that much of its last seconds asleep; running on, none."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WATCHED, "30"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        if stopped:
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(stopped)
            os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate("ask\n", timeout=30)
    finally:
        proc.kill()
    asleep = float(out.strip())
    if stopped:
        assert stopped - 0.5 <= asleep <= stopped + 1.0, asleep
    else:
        assert asleep == 0.0


class _Ended(Exception):
    """Ends the watcher's loop in a test."""


def test_a_pause_that_begins_just_after_the_watcher_reads_its_clock_is_found(monkeypatch):
    """The process stopped for 3 s at the worst moment: just after the watcher read the clock at
    a wake (a stop lands there under load, when the thread loses its core right after the
    read). The next wake is 3 s late, and the pause is noted whole."""
    clock = Clock()
    sleeps: list[float] = []
    stopped: list[float] = []

    def sleep(seconds: float) -> None:
        if len(sleeps) == 4:
            raise _Ended
        sleeps.append(seconds)
        clock.sleep(seconds)

    def read(_clock: int) -> float:
        now = clock.now
        if len(sleeps) == 2 and not stopped:  # the second wake's read: the stop begins here
            stopped.append(now)
            clock.sleep(3.0)
        return now

    fake = SimpleNamespace(sleep=sleep, clock_gettime=read, time=clock.monotonic)
    monkeypatch.setattr(awake_module, "time", fake)
    awake = Awake()
    awake.last = read(0)  # as start() does, without the thread
    with pytest.raises(_Ended):
        awake._watch()
    assert stopped, "the watcher never woke a second time"
    assert awake.asleep(clock.now - 30, clock.now) == pytest.approx(3.0)


def test_the_longest_pause_counts_those_that_ended_after_the_time_asked():
    awake = Awake()
    awake.pauses.extend([(100.0, 110.0), (200.0, 203.0)])
    longest = [awake.longest(since, 300.0) for since in (50.0, 150.0, 250.0)]
    assert longest == [10.0, 3.0, 0.0]
