"""Stragglers: a host that became slow during a run, found from its ranks' own time per image.

Pure functions, no I/O: node rank 0's agent (regrow.py) feeds ``observe`` each new log interval
of the ranks' heartbeats and, when it says so, ends the generation at the next checkpoint with
new shares of the same global batch (``weights``), which is not counted as a restart.

The measure is each host's own time per image (``sec_per_image``: the trainer's data wait and
forward pass, not the all-reduce that makes every host as slow as the slowest). With shares
``b`` and times ``t`` a step takes ``max(b * t)``; the balanced step is ``sum(b) / sum(1/t)``. A
host's load is its step over the balanced one. Each host's figure is the median of its last
``WINDOW`` intervals (2-step intervals on the sandbox put a host 1.3x over in half of them,
medians of 5 intervals of 4-6 steps never did); the run rebalances when the shares no longer fit
the speeds (``worth``) in ``NEEDED`` evaluations in a row, at most ``MOST_PER_HOUR`` times an
hour; a host under ``LEAVE_OUT`` in NEEDED intervals in a row by themselves, at once. The same
rule gives a share back once the slow host is fast again. A host slower than ``LEAVE_OUT`` is left
out instead (``too_slow``), where the run may go on without it, and asks to come back once
doctor's compute check in place is ``GAIN`` times its figure when left out, or ``BACK`` of the
median host's pace in the run as it was left out (``wanted``; gate.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

THRESHOLD = 1.3  # a host's load this far over or under the balanced step's 1.0: beyond noise
WORTH = 1.1  # the least a rebalance must gain: the step now over the balanced one
WINDOW = 5  # log intervals whose median time per image is each host's figure
NEEDED = 2  # evaluations in a row that call for new shares (worth)
MOST_PER_HOUR = 4  # rebalances, whatever the intervals say
LEAVE_OUT = 0.25  # a host under this speed (the median host's 1.0) is left out, not given a share
GAIN = 2.0  # a host left out comes back once its compute check is this many times its first
# ... or this share of the median host's images/s as it was left out: over LEAVE_OUT, so a host
# as slow as it was does not pass; under what the check (the whole step, at its own batch)
# gives at the median host's speed: 0.55-0.94x of that host's pace on the sandbox (CPU, 64 px)
BACK = 1 / 3
# ... but a host its check passed on par alone is held to its own figure for this long: the
# check times the model, not a loader or a disk that slows the ranks, so such a host is taken
# back on par at most once in this time
PAR_AGAIN = 3600.0


@dataclass(frozen=True)
class Watch:
    """What the detector remembers: the step of the last interval it saw, the hosts' times of
    the last WINDOW intervals, how many evaluations in a row were over the threshold, and
    when it rebalanced."""

    step: int = -1
    times: tuple[tuple[float, ...], ...] = ()
    over: int = 0
    rebalanced: tuple[float, ...] = ()
    far: int = 0  # intervals in a row with a host under LEAVE_OUT by themselves

    def restarted(self) -> Watch:
        """A new start of the ranks (any shares): its intervals only; the rebalances stay."""
        return Watch(rebalanced=self.rebalanced)

    def not_counted(self) -> Watch:
        """The rebalance ``observe`` just called for gave the ranks the shares they have (or
        one a share of 0, which the trainer refuses): no restart, so not one of MOST_PER_HOUR;
        it looks again after a new window."""
        return replace(self, rebalanced=self.rebalanced[:-1])


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
    far = watch.far + 1 if min(speeds(known)) < LEAVE_OUT else 0
    if far >= NEEDED and len(recent) < MOST_PER_HOUR:  # no noise comes near 4x: no window
        return Watch(step=step, rebalanced=(*recent, now)), _medians(history[-NEEDED:])
    if len(history) < WINDOW:
        return Watch(step=step, times=history, rebalanced=recent, far=far), None
    middle = _medians(history)
    over = watch.over + 1 if worth(loads(shares, middle)) else 0
    if over >= NEEDED and len(recent) < MOST_PER_HOUR:
        return Watch(step=step, rebalanced=(*recent, now)), middle
    return Watch(step=step, times=history, over=over, rebalanced=recent, far=far), None


def worth(load: Sequence[float]) -> bool:
    """Whether the hosts' loads call for new shares: a host THRESHOLD over the balanced step
    (it paces the others), or one THRESHOLD under it (a host given a smaller share that is fast
    again: the hosts that took its images are THRESHOLD over only where its share was cut to
    0.4 or less; of three equal hosts, one at half a share gains 1.25x with it back), and a gain
    of WORTH at least. Equal hosts' noise moves loads both ways alike, and the window's medians
    smooth either side (tests/unit/agent/test_stragglers.py)."""
    return max(load) >= WORTH and (max(load) >= THRESHOLD or min(load) <= 1.0 / THRESHOLD)


def _medians(history: Sequence[Sequence[float]]) -> list[float]:
    """Each host's median of the intervals' figures."""
    return [statistics.median(host) for host in zip(*history, strict=True)]


def split(total: int, weights: Sequence[float]) -> list[int]:
    """Largest-remainder split of ``total`` images proportional to ``weights`` (exact rational
    arithmetic; ties go to the lower rank): each rank's share of a step's global batch, as the
    trainer takes it (trainer.balance.split_batch, which refuses a share of 0). Sums to
    ``total``."""
    exact = [Fraction(w) for w in weights]
    quotas = [total * w / sum(exact) for w in exact]
    shares = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda r: (shares[r] - quotas[r], r))
    for r in by_remainder[: total - sum(shares)]:
        shares[r] += 1
    return shares


def weights(times: Mapping[str, float]) -> dict[str, float]:
    """Each host's new weight: its speed (relative to the median host, 3 digits)."""
    names = sorted(times)
    return {n: round(s, 3) for n, s in zip(names, speeds([times[n] for n in names]), strict=True)}


def too_slow(speed: Mapping[str, float], may_leave: Sequence[str]) -> str | None:
    """The slowest host of ``may_leave`` when it is under LEAVE_OUT: a share that small would
    pace the others' steps on its fixed costs alone (its start, its all-reduce), else None."""
    slow = [h for h in may_leave if speed.get(h, 1.0) < LEAVE_OUT]
    return min(slow, key=lambda h: speed[h]) if slow else None


def wanted(first: float, par: float | None) -> float:
    """The images/s a host left out asks to come back at: GAIN times its first compute check's
    figure (its slow pace; 0: that check did not finish, any that does will do), or BACK of
    ``par`` (the median host's images/s in the run as it was left out, for as many ranks;
    None: not known, or not to be used), whichever is lower. ``par`` takes back a host whose
    slowdown ended before its first check, which no later check doubles. The check measures
    the model alone, so a host slowed by its loader or disk passes it: its agent uses ``par``
    once (gate.py)."""
    ask = GAIN * first
    return ask if par is None or not first else min(ask, BACK * par)


def change_line(
    before: Mapping[str, int], after: Mapping[str, int], speed: Mapping[str, float]
) -> str:
    """``rebalanced: node3 4 -> 2 (0.31x)``: each host whose share of a step changed (``-> out``:
    left out)."""
    moved = [
        f"{h} {before[h]} -> {after.get(h, 'out')} ({speed.get(h, 1.0):.2f}x)"
        for h in before
        if before[h] != after.get(h)
    ]
    return "rebalanced: " + (", ".join(moved) or "the shares stay as they were")
