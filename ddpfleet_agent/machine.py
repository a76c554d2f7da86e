"""The agent's lifecycle as one state machine: what it does after each generation of ranks.

``transition(state, event) -> (state, actions)`` is pure: every rule that decides whether the
run fails over to another host's store, restarts, takes hosts back, asks to come back or ends
lives here, and ``supervise.Agent.run`` carries the actions out through its adapters (ranks,
store, records), each of which reports back what happened as the next event::

    STARTING --Began--> RUNNING (START) | LEFT_OUT (LEAVE, REJOIN again)
                        | ENDED ([LEAVE | CLAIM,] FINISH)
    RUNNING --Ended--> FAILING_OVER (FAIL_OVER) | RESTARTING (RESTART) | REGROWING (REGROW)
                       | LEFT_OUT ([REFUSE,] REJOIN) | ENDED ([REFUSE,] FINISH)
    FAILING_OVER, RESTARTING, REGROWING --Reported--> RUNNING | LEFT_OUT (REJOIN) | ENDED
    LEFT_OUT --Reported--> RUNNING | ENDED (FINISH)

Bounds: from RUNNING, at most three transitions reach RUNNING or ENDED again. A way back to
RUNNING costs a restart (FAIL_OVER, RESTART: ``failures.restart_refusal`` refuses past the
allowed count), a regrow (node rank 0 ends a generation only for a host asking to come back, or
to give the hosts new shares, a host too slow for one left out: ``failures.planned``) or a
rejoin (this host was welcomed back by the run's store). FINISH is the last action of a
transition to ENDED, and ENDED takes no event.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ddpfleet_agent import failures


class State(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    FAILING_OVER = "failing over"  # the run's store was lost: going on under another host's
    RESTARTING = "restarting"  # from the newest checkpoint
    REGROWING = "regrowing"  # restarting with hosts taken back or new shares
    LEFT_OUT = "left out"  # not in the run's generation: asking to come back
    ENDED = "ended"  # the agent's exit record is written: it exits


class Action(enum.Enum):
    START = "start"
    LEAVE = "leave"  # mark this host out of the run's generation (started again in the run)
    CLAIM = "claim"  # claim a failure of this host, the text its reason
    FAIL_OVER = "fail over"
    RESTART = "restart"
    REGROW = "regrow"
    REJOIN = "rejoin"  # ask the run's store to come back until let in or the run ends
    REFUSE = "refuse"  # say in the failure's reason why the run was not restarted
    FINISH = "finish"  # report the exit and end the ranks


@dataclass(frozen=True)
class Do:  # text: the refusal (REFUSE), reason (CLAIM), outcome (FINISH), 'again' (REJOIN)
    action: Action
    text: str = ""


@dataclass(frozen=True)
class Facts:
    """What the agent knows when it decides."""

    outcome: str = "failed"  # the last generation's ('left out' before the first)
    signalled: bool = False  # SIGTERM or SIGINT came
    store_ok: bool = True  # the run's store answers
    left_out: bool = False  # not in the run's current generation
    node_rank: int = 0
    can_fail_over: bool = False
    takes_hosts_back: bool = False
    restarts: int = 0  # allowed (--restarts)
    earlier: tuple[Mapping, ...] = ()  # the failures restarted after so far
    members: int = 1  # hosts of the generation that ended
    min_hosts: int = 0


@dataclass(frozen=True)
class Standing:
    """Where the run stands for this host, held by ``supervise.Agent`` alone: the adapters get
    it and hand a new one back. ``failure``: the one claimed (or judged) for this generation;
    ``diagnosis``: where its ranks were (bundle.py, node rank 0's)."""

    failure: failures.Failure | None = None
    diagnosis: str | None = None
    store_ok: bool = True
    left_out: bool = False


@dataclass(frozen=True)
class Began:  # the agent reached the run's store; again: its agent was started again in the run
    facts: Facts
    again: bool = False


@dataclass(frozen=True)
class Ended:  # a generation of ranks ended; cause: the failure claimed (None: none)
    facts: Facts
    cause: Mapping | None = None


@dataclass(frozen=True)
class Reported:  # an adapter's answer; regrouped: this host's ranks run in a new generation
    facts: Facts
    regrouped: bool


Event = Began | Ended | Reported
Step = tuple[State, tuple[Do, ...]]
HEALING = (State.FAILING_OVER, State.RESTARTING, State.REGROWING)
NOT_BACK = "its agent was started again in the run, which takes no host back (min hosts 0)"


def transition(state: State, event: Event) -> Step:
    """The next state and the actions that take the agent there."""
    f = event.facts
    if state is State.STARTING and isinstance(event, Began):
        if not event.again:
            return State.RUNNING, (Do(Action.START),)
        if not f.takes_hosts_back:  # the run went on with its earlier ranks, which are gone
            return State.ENDED, (Do(Action.CLAIM, NOT_BACK), Do(Action.FINISH, "failed"))
        return _rejoin_or_finish(replace(f, left_out=True), (Do(Action.LEAVE),), again=True)
    if state is State.RUNNING and isinstance(event, Ended):
        return _after_generation(f, event.cause)
    if (state in HEALING or state is State.LEFT_OUT) and isinstance(event, Reported):
        if event.regrouped:
            return State.RUNNING, ()
        # a host that asked to come back ends; one that failed over asks only if left out
        # (the new store answered otherwise: the run cannot go on)
        ends = state is State.LEFT_OUT or (state is State.FAILING_OVER and not f.left_out)
        return _finish(f, ()) if ends else _rejoin_or_finish(f, ())
    raise ValueError(f"no transition from {state.name} on {type(event).__name__}")


def _after_generation(f: Facts, cause: Mapping | None) -> Step:
    if cause and cause.get("store_lost") and f.can_fail_over and not f.signalled:
        why = _refusal({**cause, "node_rank": -1}, f)  # node rank 0's loss is no refusal here
        if why is None:  # members - 1 >= min_hosts >= 1 hosts are left: one takes over
            return State.FAILING_OVER, (Do(Action.FAIL_OVER),)
        return _finish(f, (Do(Action.REFUSE, why),) if why else ())
    said: tuple[Do, ...] = ()
    if f.outcome == "failed" and cause is not None and not f.signalled and f.store_ok:
        if failures.planned(cause):
            return State.REGROWING, (Do(Action.REGROW),)
        why = _refusal(cause, f)
        if why is None:
            return State.RESTARTING, (Do(Action.RESTART),)
        said = (Do(Action.REFUSE, why),) if why else ()
    return _rejoin_or_finish(f, said)


def _refusal(cause: Any, f: Facts) -> str | None:
    earlier: Any = list(f.earlier)
    return failures.restart_refusal(
        cause, earlier, f.restarts, members=f.members, min_hosts=f.min_hosts
    )


def _rejoin_or_finish(f: Facts, said: tuple[Do, ...], *, again: bool = False) -> Step:
    """A host out of the run (its store lost to it, or left out) asks to come back: the run
    takes hosts back, it is not the store's host or another may take over, and no stop came."""
    eligible = f.takes_hosts_back and (f.node_rank != 0 or f.can_fail_over)
    if eligible and not f.signalled and (f.left_out or not f.store_ok):
        return State.LEFT_OUT, (*said, Do(Action.REJOIN, "again" if again else ""))
    return _finish(f, said)


def _finish(f: Facts, said: tuple[Do, ...]) -> Step:
    return State.ENDED, (*said, Do(Action.FINISH, "left out" if f.left_out else f.outcome))
