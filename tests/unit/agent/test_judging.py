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


@pytest.mark.parametrize(
    ("leads", "paused", "min_hosts", "steps_down"),
    [
        (True, 10.0, 2, True),  # the store's host, paused past the peer timeout: cut off
        (True, 3.0, 2, False),  # paused, but within the peer timeout: the others waited
        (False, 10.0, 2, False),  # not the store's host: the run's store tells it the rest
        (True, 10.0, 3, False),  # too few left to go on without it: nobody takes over
    ],
)
def test_the_store_s_host_paused_past_the_peer_timeout_steps_down(
    tmp_path, leads, paused, min_hosts, steps_down
):
    """h0 serves the store and was paused (a frozen VM) with its ranks: once running again it
    reads the keepalives the others queued during the pause as fresh, and its ranks' silence
    leaves the pause out. It steps down all the same: the others lost its store and went on."""
    cfg = parse_args([
        "--run-dir", str(tmp_path), "--run-id", "t1", "--hosts", "h0,h1,h2", "--host", "h0",
        "--node-rank", "0", "--store", "127.0.0.1:1", "--attempt", "a1", "--key-file", "k",
        "--world-size", "3", "--addresses", "127.0.0.1,127.0.0.2,127.0.0.3", "--min-hosts",
        str(min_hosts), "--restarts", "2", "--peer-timeout", "4", "--", "true",
    ])  # fmt: skip
    peers = SimpleNamespace(views={}, members=[0, 1, 2], leads=leads, silent=lambda now, t: [])
    awake = SimpleNamespace(longest=lambda since, now: paused)
    ranks = SimpleNamespace(views=lambda now: [], heartbeats=dict, awake=awake)
    failure = Judge(cfg, peers, ranks).check(1000.0, 900.0)
    if not steps_down:
        assert failure is None
        return
    assert (failure["host"], failure["cut_off"]) == ("h0", True), failure
    assert failure["reason"] == "this host was paused for 10s, past the peer timeout (cut off)"
