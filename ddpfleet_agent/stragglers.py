"""Stragglers: a host that became slow during a run, found from its ranks' own time per image.

Pure functions, no I/O: node rank 0's agent (regrow.py) feeds ``observe`` each new log interval
of the ranks' heartbeats and, when it says so, ends the generation at the next checkpoint with
new shares of the same global batch (``weights``), which is not counted as a restart.

The measure is each host's own time per image (``sec_per_image``: the trainer's data wait and
forward pass, not the all-reduce that makes every host as slow as the slowest). With shares
``b`` and times ``t`` a step takes ``max(b * t)``; the balanced step is ``sum(b) / sum(1/t)``.
A host's load is its step over the balanced one. Each host's figure is the median of its last
``WINDOW`` intervals (2-step intervals on the sandbox put a host 1.3x over in half of them,
medians of 5 intervals of 4-6 steps never did); the run rebalances when a host's load was at
least ``THRESHOLD`` in ``NEEDED`` evaluations in a row, at most ``MOST_PER_HOUR`` times an
hour. The same rule gives a share back once the slow host is fast again.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

THRESHOLD = 1.3  # a host's step over the balanced step: what a rebalance would gain at least
WINDOW = 5  # log intervals whose median time per image is each host's figure
NEEDED = 2  # evaluations in a row over the threshold
MOST_PER_HOUR = 4  # rebalances, whatever the intervals say


@dataclass(frozen=True)
class Watch:
    """What the detector remembers: the step of the last interval it saw, the hosts' times of
    the last WINDOW intervals, how many evaluations in a row were over the threshold, and
    when it rebalanced."""

    step: int = -1
    times: tuple[tuple[float, ...], ...] = ()
    over: int = 0
    rebalanced: tuple[float, ...] = ()

    def restarted(self) -> Watch:
        """A new start of the ranks (any shares): its intervals only; the rebalances stay."""
        return Watch(rebalanced=self.rebalanced)


def loads(shares: Sequence[float], times: Sequence[float]) -> list[float]:
    """Each host's step time (its share times its time per image) over the balanced step."""
    balanced = sum(shares) / sum(1.0 / t for t in times)
    return [b * t / balanced for b, t in zip(shares, times, strict=True)]


def speeds(times: Sequence[float]) -> list[float]:
    """Each host's speed relative to the median host's (0.31: a third as fast)."""
    middle = statistics.median(times)
    return [middle / t for t in times]


def observe(
    watch: Watch, step: int, shares: Sequence[float], times: Sequence[float | None], now: float
) -> tuple[Watch, list[float] | None]:
    """(the detector's new state, the hosts' times to rebalance by, or None) after the
    interval that ended at ``step``; the same step again, or a host without a figure, is no
    new interval."""
    if step == watch.step or len(shares) < 2 or any(not t or t <= 0 for t in times):
        return watch, None
    recent = tuple(t for t in watch.rebalanced if now - t < 3600.0)
    if watch.step < 0:  # a start's first interval: its warm-up, not its pace
        return Watch(step=step, rebalanced=recent), None
    known = tuple(float(t) for t in times if t)
    kept = tuple(h for h in watch.times if len(h) == len(known))  # the same hosts' figures
    history = (*kept, known)[-WINDOW:]
    if len(history) < WINDOW:
        return Watch(step=step, times=history, rebalanced=recent), None
    middle = [statistics.median(host) for host in zip(*history, strict=True)]
    over = watch.over + 1 if max(loads(shares, middle)) >= THRESHOLD else 0
    if over >= NEEDED and len(recent) < MOST_PER_HOUR:
        return Watch(step=step, rebalanced=(*recent, now)), middle
    return Watch(step=step, times=history, over=over, rebalanced=recent), None


def weights(times: Mapping[str, float]) -> dict[str, float]:
    """Each host's new weight: its speed (relative to the median host, 3 digits)."""
    names = sorted(times)
    return {n: round(s, 3) for n, s in zip(names, speeds([times[n] for n in names]), strict=True)}


def change_line(
    before: Mapping[str, int], after: Mapping[str, int], speed: Mapping[str, float]
) -> str:
    """``rebalanced: node3 4 -> 2 (0.31x)``: each host whose share of a step changed."""
    moved = [
        f"{h} {before[h]} -> {after[h]} ({speed.get(h, 1.0):.2f}x)"
        for h in after
        if h in before and before[h] != after[h]
    ]
    return "rebalanced: " + (", ".join(moved) or "the shares stay as they were")
