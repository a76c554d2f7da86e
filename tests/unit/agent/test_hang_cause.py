"""Which rank a hang is blamed on, and in which words, from the hosts' rank views."""

from __future__ import annotations

import pytest

from ddpfleet_agent.failures import hang_cause

HOSTS = ["h0", "h1"]
JUDGE = "h0"  # the agent that judges it


def views(stuck: dict, peer_step: int = 12) -> dict[int, dict]:
    """h0's rank 0 waits in a collective (beating, no progress); h1's rank 1 is ``stuck``."""
    waiting = {"rank": 0, "step": peer_step, "phase": "train", "live_age": 0.4}
    return {
        0: {"ranks": [waiting | {"progress_age": 9.0}]},
        1: {"ranks": [{"rank": 1, "step": 11, "phase": "train"} | stuck]},
    }


def test_no_rank_past_the_timeout_is_no_hang():
    quiet = views({"live_age": 0.5, "progress_age": 2.0}) | {0: {}}
    assert hang_cause(quiet, HOSTS, 5, judge=JUDGE) is None


@pytest.mark.parametrize(
    ("live_age", "words"),
    [(0.6, "rank 1 hung (no progress for 7s at step 11, phase train)"),
     (5.5, "rank 1 frozen (no heartbeat for 6s at step 11, phase train)")],
)  # fmt: skip
def test_the_rank_that_stopped_first_is_named_hung_or_frozen(live_age, words):
    cause = hang_cause(views({"live_age": live_age, "progress_age": 7.0}), HOSTS, 5, judge=JUDGE)
    assert cause is not None
    assert (cause["host"], cause["node_rank"], cause["rank"]) == ("h1", 1, 1)
    assert cause["reason"] == words


def test_a_late_heartbeat_is_not_judged_until_it_is_frozen():
    """SIGSTOP freezes progress and heartbeat together: progress passes the timeout first.
    "hung" then would race the rank's own agent's "frozen" (seen in CI under load)."""
    assert hang_cause(views({"live_age": 2.9, "progress_age": 3.4}), HOSTS, 3, judge=JUDGE) is None
    cause = hang_cause(views({"live_age": 3.1, "progress_age": 3.6}), HOSTS, 3, judge=JUDGE)
    assert cause is not None
    assert "rank 1 frozen (no heartbeat for 3s" in cause["reason"]


def test_a_frozen_rank_is_blamed_before_a_live_one_at_a_lower_step():
    stuck = views({"live_age": 8.0, "progress_age": 8.0}, peer_step=3)
    cause = hang_cause(stuck, HOSTS, 5, judge=JUDGE)
    assert cause is not None
    assert cause["rank"] == 1
