"""Node rank 0's agent gives a straggler a smaller share (regrow.Lead.rebalance): from
the ranks' heartbeats as the store carries them to the claimed failure marked ``rebalance``,
the ranks' environment of the next start, and its entry in the attempts. No process: the
ranks' start is recorded, the views are set as the store would carry them."""

from __future__ import annotations

import tempfile

import pytest

from ddpfleet_agent.cli import parse_args
from ddpfleet_agent.restarts import WEIGHTS_ENV
from ddpfleet_agent.stragglers import NEEDED, WINDOW
from ddpfleet_agent.supervise import Agent


@pytest.fixture
def lead(tmp_path, monkeypatch):
    """Node rank 0's agent of h0,h1,h2 (one rank each), started once with 32 images each."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    agent = Agent(parse_args([
        "--run-dir", str(tmp_path), "--run-id", "t1", "--hosts", "h0,h1,h2", "--host", "h0",
        "--node-rank", "0", "--store", "127.0.0.1:1", "--attempt", "a1", "--key-file", "k",
        "--world-size", "3", "--", "true"]))  # fmt: skip
    started: list[dict] = []
    agent.ranks.start = lambda command, env: started.append(dict(env))
    agent.peers.members = [0, 1, 2]
    agent.started = started
    agent.starts.start()
    interval(agent, 0, [1.0, 1.0, 1.0], [32, 32, 32])
    agent.starts.track(0.0)
    return agent


def rebalance(agent, now):
    """Node rank 0's straggler watch at ``now``, over the shares its starts use."""
    return agent.lead.rebalance(now, agent.starts.weights)


def interval(agent, step, times, shares, saved=0):
    agent.peers.views = {
        n: {"ranks": [{"rank": n, "phase": "train", "step": step, "interval_step": step,
                       "batch": b, "sec_per_image": t, "saved": saved, "total_steps": 400}]}
        for n, (t, b) in enumerate(zip(times, shares, strict=True))
    }  # fmt: skip


def test_a_slowed_host_gets_a_smaller_share_at_the_next_checkpoint(lead):
    said = []
    lead.lead.say = said.append
    for i in range(WINDOW + NEEDED):  # a warm-up interval, a window, then NEEDED with h2 slow
        interval(lead, 10 + i * 10, [0.01, 0.01, 0.031], [32, 32, 32], saved=40)
        assert rebalance(lead, float(i)) is None
    assert said == ["hosts' speeds h0 1.00x, h1 1.00x, h2 0.32x: new shares at the run's "
                    "next checkpoint"]  # fmt: skip
    interval(lead, 60, [0.01, 0.01, 0.031], [32, 32, 32], saved=40)
    assert rebalance(lead, 10.0) is None  # the checkpoint it saw when it decided: not yet
    interval(lead, 65, [0.01, 0.01, 0.031], [32, 32, 32], saved=60)
    cause = rebalance(lead, 11.0)
    assert cause is not None
    assert cause["reason"] == "new shares after the checkpoint of step 60"
    assert (cause["host"], cause["rebalance"]) == ("h2", {"h0": 1.0, "h1": 1.0, "h2": 0.323})
    assert not cause.get("restartable")
    assert not cause.get("gone")

    lead.starts.weights = cause["rebalance"]  # as Heal.regrown has it on every member
    lead.starts.start(cause)
    assert lead.started[-1][WEIGHTS_ENV] == "1,1,0.323"
    assert lead.starts.attempts[-1]["cause"] == "rebalanced"
    interval(lead, 60, [0.01, 0.01, 0.01], [41, 41, 14])
    lead.starts.track(12.0)
    entry = lead.starts.attempts[-1]
    assert entry["shares"] == [41, 41, 14]
    assert entry["global_batch"] == 96
    assert entry["cause"] == (
        "rebalanced: h0 32 -> 41 (1.00x), h1 32 -> 41 (1.00x), h2 32 -> 14 (0.32x)"
    )
    assert entry["speeds"] == {"h0": 1.0, "h1": 1.0, "h2": 0.323}


def test_no_new_shares_with_rebalance_off_or_for_a_program_without_the_figure(lead):
    lead.cfg.rebalance = "off"
    for i in range(2 * WINDOW + NEEDED):
        interval(lead, 10 + i * 10, [0.01, 0.01, 0.05], [32, 32, 32], saved=10 * i)
        assert rebalance(lead, float(i)) is None
    assert lead.lead.rebalance_wait is None
    lead.cfg.rebalance = "auto"
    for i in range(2 * WINDOW + NEEDED):  # a user's program: its heartbeats have no sec_per_image
        interval(lead, 10 + i * 10, [None, None, None], [32, 32, 32], saved=10 * i)
        assert rebalance(lead, float(i)) is None
    assert lead.lead.rebalance_wait is None


def test_the_run_s_last_checkpoint_is_no_time_for_new_shares(lead):
    for i in range(WINDOW + NEEDED):
        interval(lead, 380 + i, [0.01, 0.01, 0.05], [32, 32, 32], saved=390)
        rebalance(lead, float(i))
    assert lead.lead.rebalance_wait is not None
    interval(lead, 400, [0.01, 0.01, 0.05], [32, 32, 32], saved=400)
    assert rebalance(lead, 10.0) is None
    assert lead.lead.rebalance_wait is None


def test_each_host_s_speed_ratio_is_a_metric(lead):
    """ddpfleet_host_speed_ratio: this host's own time per image against the median host's,
    from the views every agent has (node rank 0's here, a third as fast as h2)."""
    from ddpfleet_agent.exporter import Gpus, RunCollector  # noqa: PLC0415 (prometheus_client)

    interval(lead, 10, [0.01, 0.0098, 0.0033], [32, 32, 32])
    assert lead.lead.speed() == 0.98
    read = lambda: (0, 0.0, {}, lead.lead.speed())  # noqa: E731
    found = {f.name: f.samples for f in RunCollector(lead.cfg, read, Gpus()).collect()}
    assert found["ddpfleet_host_speed_ratio"][0].value == 0.98
    lead.peers.views[1]["ranks"][0]["sec_per_image"] = None  # a host without the figure
    assert lead.lead.speed() is None
    read = lambda: (0, 0.0, {}, None)  # noqa: E731
    assert "ddpfleet_host_speed_ratio" not in {
        f.name for f in RunCollector(lead.cfg, read, Gpus()).collect()
    }


def slow_h2(agent, saved_at_end):
    """A warm-up interval, a window and NEEDED more with h2 a tenth as fast (decided), then the
    next checkpoint: the claimed failure node rank 0 ends the generation with, or None."""
    for i in range(WINDOW + NEEDED):
        interval(agent, 10 + i * 10, [0.01, 0.01, 0.1], [32, 32, 32], saved=40)
        assert rebalance(agent, float(i)) is None
    interval(agent, 65, [0.01, 0.01, 0.1], [32, 32, 32], saved=saved_at_end)
    return rebalance(agent, 11.0)


def test_a_host_too_slow_for_a_share_is_left_out_where_the_run_may_go_on_without_it(lead):
    said = []
    lead.lead.say = said.append
    lead.cfg.min_hosts, lead.cfg.restarts = 2, 1  # the run takes hosts back
    cause = slow_h2(lead, 60)
    assert said == ["hosts' speeds h0 1.00x, h1 1.00x, h2 0.10x: h2 left out at the run's next "
                    "checkpoint"]  # fmt: skip
    assert cause is not None
    assert cause["reason"] == "h2 left out after the checkpoint of step 60"
    assert cause["leave_out"] == [2]
    # back at a full share once its compute check passes (gate.py); the others' as measured
    assert cause["rebalance"] == {"h0": 1.0, "h1": 1.0, "h2": 1.0}
    assert cause["speeds"]["h2"] == 0.1
    assert cause["pace"] == 0.01  # the median host's seconds per image: h2's check is held to it

    lead.starts.weights = cause["rebalance"]
    lead.peers.members = [0, 1]  # as the regroup without h2 has it (Heal.regrown)
    lead.starts.start(cause)
    interval(lead, 60, [0.01, 0.01], [48, 48])
    lead.starts.track(12.0)
    entry = lead.starts.attempts[-1]
    assert (entry["hosts"], entry["shares"], entry["global_batch"]) == (["h0", "h1"], [48, 48], 96)
    assert (
        entry["cause"]
        == "rebalanced: h0 32 -> 48 (1.00x), h1 32 -> 48 (1.00x), h2 32 -> out (0.10x)"
    )


@pytest.mark.parametrize(("min_hosts", "restarts"), [(0, 1), (2, 0), (3, 1)])
def test_a_run_that_cannot_go_on_without_it_gives_it_a_small_share(lead, min_hosts, restarts):
    """No hosts taken back (min hosts or restarts 0), or too few left without it."""
    lead.cfg.min_hosts, lead.cfg.restarts = min_hosts, restarts
    cause = slow_h2(lead, 60)
    assert cause is not None
    assert "leave_out" not in cause
    assert cause["rebalance"]["h2"] == 0.1


def test_the_store_s_host_is_never_left_out(lead):
    """Node rank 0 serves the run's store: a share as small as its speed, not left out."""
    lead.cfg.min_hosts, lead.cfg.restarts = 2, 1
    for i in range(WINDOW + NEEDED):
        interval(lead, 10 + i * 10, [0.1, 0.01, 0.01], [32, 32, 32], saved=40)
        rebalance(lead, float(i))
    interval(lead, 65, [0.1, 0.01, 0.01], [32, 32, 32], saved=60)
    cause = rebalance(lead, 11.0)
    assert cause is not None
    assert "leave_out" not in cause
    assert cause["rebalance"]["h0"] == 0.1


def straggle(agent, times, shares, rounds):
    """``rounds`` windows of intervals at ``times`` over ``shares``: each call's answer."""
    answers = []
    for i in range(rounds * (WINDOW + NEEDED)):
        interval(agent, 10 + i * 10, times, shares, saved=10 * i)
        answers.append(rebalance(agent, float(i)))
    return answers


def test_new_weights_that_split_the_batch_as_now_restart_nothing(lead):
    """h2 paces a step of 2 images a rank at 0.6x (1.3x the balanced step), but 6 images
    split 1 : 1 : 0.6 are still 2, 2, 2 (the trainer's largest-remainder split): no restart,
    said once, and not one of the rebalances an hour allows."""
    said = []
    lead.lead.say = said.append
    answers = straggle(lead, [0.01, 0.01, 0.01 / 0.6], [2, 2, 2], rounds=3)
    assert answers == [None] * len(answers)
    assert lead.lead.rebalance_wait is None
    kept = ("hosts' speeds h0 1.00x, h1 1.00x, h2 0.60x: the shares they give are the ones the "
            "ranks have; no restart")  # fmt: skip
    assert said == [kept]
    assert lead.lead.watch.rebalanced == ()
    lead.lead.restarted()  # a new start (another cause): said again once
    straggle(lead, [0.01, 0.01, 0.01 / 0.6], [2, 2, 2], rounds=2)
    assert said == [kept, kept]


def test_new_weights_that_would_give_a_rank_no_image_restart_nothing(lead):
    """One image a rank, h2 a tenth as fast: 3 images split 1 : 1 : 0.1 give h2's rank 0,
    which the trainer refuses (its restart would fail the run)."""
    said = []
    lead.lead.say = said.append
    answers = straggle(lead, [0.01, 0.01, 0.1], [1, 1, 1], rounds=2)
    assert answers == [None] * len(answers)
    assert lead.lead.rebalance_wait is None
    assert said == ["hosts' speeds h0 1.00x, h1 1.00x, h2 0.10x: a rank of h2 would get 0 of "
                    "the 3 images; no restart"]  # fmt: skip
