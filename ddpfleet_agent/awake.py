"""The agent's own pauses: the time it was stopped with everything around it (its whole host or
container paused, a VM frozen, a host stalled in swap), which no rank's silence may count.

A rank is frozen when its heartbeat is older than the heartbeat timeout. But an agent paused
together with its ranks wakes up to their heartbeats as old as the pause: counted as silence,
it would claim ``rank N frozen`` and restart the run in place, though nothing stopped but the
host as a whole, and its peers may not even have noticed. So a watcher thread sleeps ``TICK``
s at a time and notes each wake that comes ``PAUSED`` s late or more; a rank's ages (ranks.py
``rank_views``) leave out the time this agent was paused. A wake the watcher has not noted yet
(the main thread ran first after the pause) counts too. Slower judging is all a pause of the
agent alone can cost: a rank frozen meanwhile is still found, that much later. The store's host
also steps down when its longest recent pause passed the peer timeout (judging.py): the others
have lost its store and gone on, whatever keepalives of theirs it reads as it wakes.
"""

from __future__ import annotations

import threading
import time
from collections import deque

TICK = 0.25  # the watcher's sleep
PAUSED = 2.0  # a wake this late (s) was a pause: well over a busy host's scheduling delays
KEEP = 64  # pauses kept (the oldest go first)
# a clock that counts a suspended host's sleep as well (wall-clock steps do not move it)
CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def paused_within(pauses: list[tuple[float, float]], since: float, now: float) -> float:
    """Seconds of [since, now] covered by the (start, end) ``pauses``, overlaps counted once."""
    total, reached = 0.0, since
    for began, ended in sorted(pauses):
        start, end = max(began, reached), min(ended, now)
        if end > start:
            total += end - start
            reached = end
    return total


class Awake:
    """This agent's pauses on the wall clock (the ranks' heartbeats' clock), from ``start()``."""

    def __init__(self, tick: float = TICK, paused: float = PAUSED) -> None:
        self.tick, self.paused = tick, paused
        self.pauses: deque[tuple[float, float]] = deque(maxlen=KEEP)
        self.last = 0.0  # the watcher's last wake (CLOCK), from start()
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        if self._watcher is None:
            self.last = time.clock_gettime(CLOCK)
            self._watcher = threading.Thread(target=self._watch, name="awake", daemon=True)
            self._watcher.start()

    def _late(self, woke: float) -> float:
        """How much later than its sleep a wake of the watcher at ``woke`` (CLOCK) is."""
        return woke - self.last - self.tick

    def _watch(self) -> None:
        while True:
            time.sleep(self.tick)
            # One read: a pause that begins just after it is in the next wake's lateness. With a
            # second read for ``last``, a pause between the two was in neither (a SIGSTOP there,
            # under load, left a 3 s stop unnoticed).
            woke = time.clock_gettime(CLOCK)
            if (late := self._late(woke)) >= self.paused:
                now = time.time()
                self.pauses.append((now - late, now))
            self.last = woke

    def _noted(self, now: float) -> list[tuple[float, float]]:
        """The pauses noted, and a wake the watcher has not noted yet (the main thread ran first
        after the pause): the watcher is that late now."""
        late = self._late(time.clock_gettime(CLOCK)) if self._watcher else 0.0
        return [*self.pauses, *([(now - late, now)] if late >= self.paused else [])]

    def longest(self, since: float, now: float) -> float:
        """The longest pause of this agent that ended after ``since``."""
        return max((end - start for start, end in self._noted(now) if end > since), default=0.0)

    def asleep(self, since: float, now: float) -> float:
        """Seconds of [since, now] (wall clock) this agent was paused."""
        return paused_within(self._noted(now), since, now)
