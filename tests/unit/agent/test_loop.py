"""supervise.Agent._run carries out machine.py's decisions: the agent's loop, with its adapters
scripted (no process, store or rank), gives the machine the agent's own facts (its restarts so
far, members, store, config) and carries each action out (REFUSE says why in the failure,
CLAIM claims one, LEAVE and REJOIN ask to come back, FINISH ends with the machine's outcome).

The rules themselves are rows of test_machine.py; the I/O each adapter does is exercised by the
real agents of test_agent.py, test_restarts.py and test_failover.py."""

from __future__ import annotations

import signal
import tempfile
from dataclasses import replace

import pytest

from ddpfleet_agent.cli import parse_args
from ddpfleet_agent.machine import NOT_BACK
from ddpfleet_agent.supervise import Agent

EXIT = {"host": "h1", "node_rank": 1, "rank": 1, "exit_code": 1, "step": 4, "restartable": True,
        "gone": False, "reason": "rank 1 exited with code 1"}  # fmt: skip
BAD_INPUT = {**EXIT, "exit_code": 2}  # not restarted: the run ends after its next generation
STORE_LOST = {"host": "h0", "node_rank": 0, "rank": 0, "exit_code": None, "step": 9,
              "restartable": False, "gone": True, "store_lost": True,
              "reason": "lost the connection to the run's store on h0 (refused)"}  # fmt: skip


@pytest.fixture
def scripted(tmp_path, monkeypatch):
    """make(node_rank, *options, again=, generations=): an Agent of h0,h1,h2 whose adapters
    only record what they are asked; each of ``generations`` is (failure, store_ok) that its
    supervision ends with. The agent's log goes to tmp_path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the agent's heartbeat directory
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def make(node_rank, *options, again=False, generations=()):
        args = ["--run-dir", str(tmp_path), "--run-id", "t1", "--hosts", "h0,h1,h2",
                "--host", f"h{node_rank}", "--node-rank", str(node_rank),
                "--store", "127.0.0.1:1", "--attempt", "a1", "--key-file", "k", *options,
                "--", "true"]  # fmt: skip
        agent = Agent(parse_args(args))
        calls: list[tuple] = []
        script = list(generations)

        def call(what, started, standing):  # an adapter's answer, recorded
            calls.append(what)
            return started, standing

        def supervise():
            failure, store_ok = script.pop(0)
            agent.standing = replace(agent.standing, failure=failure, store_ok=store_ok)
            calls.append(("supervise",))
            return "failed", 1

        def restarted(standing):  # as restarts.Starts.restarted does, less the ranks and store
            agent.starts.causes.append(standing.failure)
            calls.append(("restart",))
            return True, standing

        agent.peers.read_key = agent.peers.connect = lambda: None
        agent.peers.ran_before = lambda: again
        agent.peers.claim = lambda failure: calls.append(("claim", failure)) or failure
        agent.heal.moved_on = lambda: False
        agent.starts.start = lambda: calls.append(("start",))
        agent._supervise = supervise
        agent.starts.restarted = restarted
        agent.heal.failed_over = lambda standing: call(("fail over",), True, standing)
        # not let back
        agent.heal.rejoined = lambda standing, again: call(("rejoin", again), False, standing)
        agent._finish = lambda outcome, code: calls.append(("finish", outcome, code)) or code
        return agent, calls

    yield make
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def test_the_same_rank_failing_at_the_same_step_is_restarted_once_then_refused(scripted):
    """--restarts 5: the machine hears of the restart the agent made (its earlier causes) and
    refuses the second failure at the same step instead of looping (moved here from the real
    agents of test_restarts.py, which still restart a failed rank in place for real)."""
    agent, calls = scripted(1, "--restarts", "5", generations=[(EXIT, True), (EXIT, True)])
    assert agent._run() == 1
    assert calls == [("start",), ("supervise",), ("restart",), ("supervise",),
                     ("finish", "failed", 1)]  # fmt: skip
    assert agent.starts.restarts == 1
    assert agent.standing.failure["reason"] == (
        "rank 1 exited with code 1; not restarted: rank 1 failed again at step 4 "
        "(a deterministic error)"
    )


def test_a_failure_at_another_step_is_restarted_until_the_restarts_are_used(scripted):
    later = {**EXIT, "step": 9}
    agent, calls = scripted(1, "--restarts", "1", generations=[(EXIT, True), (later, True)])
    assert agent._run() == 1
    assert [c[0] for c in calls] == ["start", "supervise", "restart", "supervise", "finish"]
    assert agent.standing.failure["reason"].endswith("; not restarted: all 1 restart(s) used")


def test_an_agent_started_again_in_a_run_that_takes_no_host_back_claims_why_and_starts_none(
    scripted,
):
    """h2's agent started again (the store has its keepalive) without --min-hosts: it claims
    the run failed on its host, saying why, and starts no rank (moved here from test_restarts.py;
    the real agents still find an agent started again (test_restarts.py) and end the run on
    an own-host failure claimed in the store (test_agent.py's defect in the agent)."""
    agent, calls = scripted(2, "--restarts", "1", again=True)
    assert agent._run() == 1
    (claim, claimed), finish = calls
    assert claim == "claim"
    assert (claimed["host"], claimed["node_rank"], claimed["reason"]) == ("h2", 2, NOT_BACK)
    assert finish == ("finish", "failed", 1)
    assert agent.standing.failure == claimed


def test_an_agent_started_again_in_a_run_that_takes_hosts_back_asks_to_come_back(scripted):
    """The same agent with --min-hosts 2: left out, it asks to come back (REJOIN 'again') and,
    not let back, ends left out."""
    agent, calls = scripted(2, "--restarts", "1", "--min-hosts", "2", again=True)
    assert agent._run() == 1
    assert calls == [("rejoin", True), ("finish", "left out", 1)]
    assert agent.standing.left_out


SHRINKS = ["--restarts", "2", "--world-size", "3", "--addresses", "127.0.0.1,127.0.0.2,127.0.0.3"]


@pytest.mark.parametrize(
    ("min_hosts", "expected", "refusal"),
    [("2", ["start", "supervise", "fail over", "supervise", "finish"], None),
     ("3", ["start", "supervise", "finish"],
      "not restarted: 2 host(s) left, train_min_hosts is 3")],
)  # fmt: skip
def test_the_store_s_host_lost_fails_over_only_with_enough_hosts_left(
    scripted, min_hosts, expected, refusal
):
    """h0 lost with the store, 3 members: with --min-hosts 3 the run fails naming h0 and why
    (moved here from test_failover.py's real agents, which still lose h0's store for real)."""
    agent, calls = scripted(1, *SHRINKS, "--min-hosts", min_hosts,
                            generations=[(STORE_LOST, False), (BAD_INPUT, True)])  # fmt: skip
    assert agent._run() == 1
    assert [c[0] for c in calls] == expected
    if refusal:
        assert agent.standing.failure["reason"] == f"{STORE_LOST['reason']}; {refusal}"
        assert agent.standing.failure["host"] == "h0"


def test_the_agent_is_built_of_parts_that_hold_no_reference_to_it(scripted):
    """No mixins: each part holds its own state and collaborators, never the agent itself (its
    say() is the one callable of the agent's they get)."""
    agent, _ = scripted(0)
    assert Agent.__bases__ == (object,)
    parts = (agent.judge, agent.starts, agent.lead, agent.heal, agent.ending)
    for part in parts:
        assert all(held is not agent for held in vars(part).values()), part
