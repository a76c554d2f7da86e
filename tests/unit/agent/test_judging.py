"""How an agent names the cause of its command's exit (judging.Judge.ended): a host silent at
the end of the watch is named gone only if it stays silent through a second one. No process:
the store and the ranks are stand-ins; the watch is shortened to a few ticks."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from ddpfleet_agent.cli import parse_args
from ddpfleet_agent.judging import Judge
from ddpfleet_agent.machine import Standing


@pytest.mark.parametrize(
    ("silences", "named", "watches"),
    [
        ([[]], "h1", 1),  # every host heard: one watch, the first cause (h1's own rank)
        ([[0], []], "h1", 2),  # h0's agent lagged past the first watch, then spoke
        ([[0], [0]], "h0", 2),  # h0 stays silent: its container or host is gone
    ],
)
def test_a_host_silent_after_a_rank_failed_is_named_gone_only_if_it_stays_silent(
    tmp_path, silences, named, watches
):
    """h1's rank exits with code 3 while h0's agent is silent at the end of the watch (a busy
    host's agent lagging, or not heard yet in a run's first seconds). Naming h0 gone would
    restart the run without a healthy host, or end it: h0 gets a second watch to speak."""
    cfg = parse_args([
        "--run-dir", str(tmp_path), "--run-id", "t1", "--hosts", "h0,h1", "--host", "h1",
        "--node-rank", "1", "--store", "127.0.0.1:1", "--attempt", "a1", "--key-file", "k",
        "--world-size", "2", "--", "true",
    ])  # fmt: skip
    cfg = dataclasses.replace(cfg, settle=0.05, tick=0.02)
    asked: list[float] = []

    def silent(now: float, after: float) -> list[int]:
        asked.append(after)
        return silences[len(asked) - 1]

    peers = SimpleNamespace(views={}, members=[0, 1], exchange=lambda record: (None, None),
                            silent=silent, exit_causes=list, claim=lambda f: f)  # fmt: skip
    ranks = SimpleNamespace(wait_output=lambda: None, heartbeats=dict,
                            failed_rank=lambda code: (1, 3, "rank 1 exited with code 3"),
                            record=lambda state: {"state": state})  # fmt: skip
    outcome, code, standing = Judge(cfg, peers, ranks).ended(3, Standing(), stopping=False)
    assert (outcome, code, len(asked)) == ("failed", 3, watches)
    assert asked == [pytest.approx(0.75 * 0.05)] * watches
    failure = standing.failure
    assert (failure["host"], failure["gone"]) == (named, named == "h0"), failure
    reason = "host stopped responding" if named == "h0" else "rank 1 exited with code 3"
    assert failure["reason"].startswith(reason), failure
