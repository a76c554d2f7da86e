"""A clock the test moves, for code that reads the time and sleeps: exact at any CPU load."""

from __future__ import annotations


class Clock:
    """Stands in for time.monotonic (or perf_counter) and time.sleep: sleeping advances it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
