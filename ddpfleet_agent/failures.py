"""The failure rules of a run: every way the agents judge a run failed, in one place.

A ``Failure`` is a JSON object: it goes through the run's store to the other agents and into
summary.json. The agent that sees one claims it in the store, so every host names the same
cause. A rank's own non-zero exit is named from torchrun's root cause (ranks.py); ``first_cause``
picks which of the hosts' exits ended the run; ``restart_refusal`` says whether the agents
restart the run from its newest checkpoint (``--restarts``) or end it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from signal import SIGBUS, SIGFPE, SIGILL, SIGKILL, SIGSEGV
from typing import TypedDict

from ddpfleet_agent.ranks import FROZEN_AFTER, exit_signal

# A rank's heartbeat thread beats every second (DDPFLEET_HEARTBEAT_INTERVAL): this recent runs.
LIVE_FRESH = 2.5

# A rank that died of one of these was ended from outside (the OOM killer, kill -9) or crashed
# on its own. A rank that lost a peer ends otherwise: an exception of its collective (an exit
# code), NCCL's watchdog (SIGABRT), or its launcher ending its siblings (SIGTERM).
CAUSE_SIGNALS = frozenset({SIGKILL, SIGSEGV, SIGBUS, SIGILL, SIGFPE})


class Failure(TypedDict, total=False):
    host: str  # the host named as the cause
    node_rank: int
    rank: int | None  # its global rank, where one rank is to blame
    exit_code: int | None  # None: it did not exit (frozen, hung, gone, cut off)
    reason: str  # one line, e.g. "rank 2 frozen (no heartbeat for 31s at step 7, phase train)"
    time: float
    claimed_by: str  # the host whose agent judged it
    step: int | None  # the step the rank to blame had reached, where known
    restartable: bool  # a rank's failure on a host still there: restarting in place may heal it
    gone: bool  # the host itself is gone or cut off: the run may go on without it (--min-hosts)
    regrow: list[int]  # not a failure: hosts left out are back, the generation ends (regrow.py)
    rebalance: dict[str, float]  # not a failure either: each host's new weight (regrow.py)
    speeds: dict[str, float]  # with rebalance: each host's speed, the median host's 1.0
    leave_out: list[int]  # with rebalance: a host too slow for a share goes (gate.py)
    pace: float  # with leave_out: the median host's seconds per image (a rank's) then (gate.py)
    store_lost: bool  # the run's store is gone with its host: another may take over (failover.py)
    cut_off: bool  # the store's host lost every other host at once: it steps down (failover.py)


def planned(cause: Mapping | None) -> bool:
    """A generation ended on purpose at a checkpoint (regrow.py): no forensics, no restart."""
    return bool(cause and (cause.get("regrow") or cause.get("rebalance")))


# A rank's own verdict that a restart would fail the same way (trainer.runner's exit codes):
# bad input, and a loss that became non-finite (the same data and weights diverge again).
FINAL_EXITS = {2: "bad input", 3: "the loss became non-finite"}


def failure(
    hosts: list[str],
    node: int,
    rank: int | None,
    code: int | None,
    reason: str,
    *,
    judge: str,
    step: int | None = None,
    restartable: bool = False,
    gone: bool = False,
) -> Failure:
    return {"host": hosts[node], "node_rank": node, "rank": rank, "exit_code": code,
            "reason": reason, "time": time.time(), "claimed_by": judge, "step": step,
            "restartable": restartable, "gone": gone}  # fmt: skip


def too_few(members: int, min_hosts: int) -> str:
    """Why the run cannot go on with ``members`` hosts, '' when it can (min_hosts 0: shrinking
    was not asked for, a host gone ends the run as it always did)."""
    if min_hosts and members < min_hosts:
        return f"{members} host(s) left, train_min_hosts is {min_hosts}"
    return ""


def restart_refusal(
    cause: Failure, earlier: list[Failure], allowed: int, *, members: int = 0, min_hosts: int = 0
) -> str | None:
    """None when a failed run restarts (in place, or without a host gone) after the restarts
    ``earlier`` caused; else why not, '' when that goes without saying (restarts off, a host
    gone with shrinking off, the store lost, the time limit). ``members``: the hosts of the
    attempt that failed. The store's host gone took the agents' store and torchrun's with it;
    the same rank failing at the same step again is a deterministic error: it must not loop."""
    gone, code = cause.get("gone"), cause.get("exit_code")
    if allowed <= 0 or not (min_hosts if gone else cause.get("restartable")):
        return ""
    last = earlier[-1] if earlier else {}
    rank, step = cause.get("rank"), cause.get("step")
    if gone and cause.get("node_rank") == 0:
        why = "the host of the run's store (node rank 0) is gone"
    elif gone and too_few(members - 1, min_hosts):
        why = too_few(members - 1, min_hosts)
    elif not gone and code in FINAL_EXITS:
        why = f"{FINAL_EXITS[code]} (exit code {code})"  # type: ignore[index]
    elif len(earlier) >= allowed:
        why = f"all {allowed} restart(s) used"
    elif step is not None and (last.get("rank"), last.get("step")) == (rank, step):
        why = f"rank {rank} failed again at step {step} (a deterministic error)"
    else:
        return None
    return f"not restarted: {why}"


def rank_problem(
    beats: list[dict], heartbeat_timeout: float, stop_timeout: float
) -> tuple[int, str] | None:
    """(rank, reason) of a local rank frozen past the heartbeat timeout, or None. A rank "done"
    is exiting (teardown takes seconds on a busy host) until it outlasts the stop timeout too."""
    for r in beats:
        done = r["phase"] == "done"
        limit = max(heartbeat_timeout, stop_timeout) if done else heartbeat_timeout
        if r["live_age"] is not None and r["live_age"] > limit:
            what = "did not exit" if done else "frozen"
            return r["rank"], (
                f"rank {r['rank']} {what} (no heartbeat for {r['live_age']:.0f}s "
                f"at step {r['step']}, phase {r['phase']})"
            )
    return None


def host_problem(
    silent: list[int], hosts: int, this_node: int, peer_timeout: float
) -> tuple[int, str] | None:
    """(node, reason) when other hosts' agents are silent past the peer timeout, or None:
    every other one at once (with two or more) means this host is the one cut off."""
    if not silent:
        return None
    if hosts >= 3 and len(silent) == hosts - 1:
        return this_node, "lost contact with every other host (this host is cut off)"
    return silent[0], (
        f"no keepalive from its agent for {peer_timeout:.0f}s (host unreachable or gone)"
    )


def runtime_problem(started: float, now: float, max_runtime: float) -> str | None:
    if max_runtime and started and now - started > max_runtime:
        return f"still running after max_runtime {max_runtime:.0f}s"
    return None


def hang_cause(
    views: dict[int, dict], hosts: list[str], timeout: float, *, judge: str
) -> Failure | None:
    """The root cause of a hang, or None: when some rank in phase train/validate has not
    progressed for `timeout` s, the rank whose step stopped first (frozen before live, then
    lowest step, then the longest without progress). Frozen: silent past min(FROZEN_AFTER,
    timeout), its own agent's limit; hung: still beating. A root cause whose heartbeat is late
    but not that late is not judged yet: a frozen rank's progress passes `timeout` first, and
    calling it "hung" would race its own agent's "frozen"."""
    ranks = [(node, r) for node, view in views.items() for r in view.get("ranks") or []]
    if not any(
        r.get("phase") in ("train", "validate") and (r.get("progress_age") or 0) > timeout
        for _, r in ranks
    ):
        return None

    def frozen(r: dict) -> bool:
        return (r.get("live_age") or 0) > min(FROZEN_AFTER, timeout)

    def key(item: tuple[int, dict]) -> tuple[bool, int, float]:
        r = item[1]
        return not frozen(r), int(r.get("step") or 0), -float(r.get("progress_age") or 0)

    node, r = min(ranks, key=key)
    cold = frozen(r)
    if not cold and (r.get("live_age") or 0) > LIVE_FRESH:
        return None  # its heartbeat is late: frozen soon, or beating again
    what = "frozen (no heartbeat" if cold else "hung (no progress"
    age = r.get("live_age" if cold else "progress_age")
    at = f"at step {r.get('step')}, phase {r.get('phase')})"
    reason = f"rank {r['rank']} {what} for {float(age or 0):.0f}s {at}"
    step = int(r.get("step") or 0)
    return failure(hosts, node, r["rank"], None, reason, judge=judge, step=step, restartable=True)


def first_cause(exits: list[Failure]) -> Failure:
    """The exit that ended the run, of those seen within the settle time: a rank killed or
    crashed (CAUSE_SIGNALS) before an error exit, then the earliest. A dead rank's peers fail
    within a second too, and may claim first: a user program's rank that loses its peer
    raises sooner than the dead rank's torchrun exits."""
    return min(
        exits,
        key=lambda f: (
            0 if exit_signal(f.get("exit_code")) in CAUSE_SIGNALS else 1,
            f.get("time") or math.inf,
        ),
    )
