"""Which of the hosts' failed exits ended a run (failures.first_cause)."""

from __future__ import annotations

import pytest

from ddpfleet_agent.failures import failure, first_cause

HOSTS = ["h0", "h1", "h2"]


def exit_of(node: int, code: int, at: float) -> dict:
    return failure(HOSTS, node, node, code, f"rank {node} exit {code}", judge=HOSTS[node]) | {
        "time": at
    }


@pytest.mark.parametrize(
    ("killed_code", "named"),
    [(-9, "h1"), (137, "h1"), (-11, "h1"), (-6, "h0"), (-15, "h0"), (2, "h0")],
)
def test_a_rank_killed_or_crashed_is_named_before_one_that_exited_sooner(killed_code, named):
    """h0's rank exited with an error first; h1's died later of killed_code. SIGKILL (also as
    a shell's 137) and SIGSEGV name h1; SIGABRT (NCCL's watchdog), SIGTERM (a launcher ending
    its siblings) and an exit code are what a peer of a dead rank ends with: the first, h0."""
    exits = [exit_of(0, 1, at=100.0), exit_of(1, killed_code, at=100.8)]
    assert first_cause(exits)["host"] == named
    assert first_cause(exits[::-1])["host"] == named  # the order the exits were read in


def test_among_the_same_kind_the_earliest_exit_is_the_cause():
    exits = [exit_of(2, -9, at=101.0), exit_of(1, -9, at=100.5), exit_of(0, 1, at=99.0)]
    assert first_cause(exits)["host"] == "h1"
