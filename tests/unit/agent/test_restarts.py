"""Restarts in place (``--restarts``): real agents on localhost restart their fake ranks after a
rank's failure, record each start, and refuse to loop on a deterministic error."""

from __future__ import annotations

import json
import signal
import tempfile
import time
from types import SimpleNamespace

import pytest

from ddpfleet_agent.cli import parse_args
from ddpfleet_agent.failures import restart_refusal
from ddpfleet_agent.regrow import ASK_EVERY, Lead
from ddpfleet_agent.supervise import Agent


def test_a_rank_that_fails_once_is_restarted_in_place_and_the_run_completes(cluster):
    c = cluster(3, restarts=1)
    # what trainer rank 0 leaves behind at the end of the last start (the fake ranks write none)
    c.part_path.write_text(json.dumps({"status": "completed", "world_size": 3}))
    c.start({0: "run:20", 1: "crash:4:1", 2: "run:20", "0_R1": "run:3", "1_R1": "run:3",
             "2_R1": "run:3"})  # fmt: skip
    assert c.wait() == [0, 0, 0], c.output()
    progress = c.json("progress.json")
    assert (progress["status"], progress["restarts"]) == ("completed", 1), progress
    first, second = progress["attempts"]
    assert [first["restart"], second["restart"]] == [0, 1]
    assert first["cause"] is None
    assert second["cause"].startswith("run t1 failed: host h1 rank 1: rank 1 exited with code 1")
    assert first["ended"] <= second["started"] < second["ended"]
    assert 0 < second["heal_sec"] < 15, second  # the failure to the restarted ranks' first step
    assert second["hosts"] == c.hosts
    summary = c.json("summary.json")
    assert (summary["status"], summary["restarts"]) == ("completed", 1)
    assert [a["restart"] for a in summary["attempts"]] == [0, 1]
    report = (c.run_dir / "report.txt").read_text()  # drawn after the attempts were recorded
    assert f"restart 1 at step {second['from_step']} (healed in {second['heal_sec']} s)" in report
    for host in c.hosts:
        log = (c.run_dir / "nodes" / f"{host}.log").read_text()
        assert (
            "restart 1 of 1 in place from the newest checkpoint after: run t1 failed: host h1"
            in log
        )
        assert c.json(f"nodes/{host}.exit")["outcome"] == "completed"


def test_a_rank_s_verdict_that_a_restart_cannot_help_ends_the_run_at_once(cluster):
    c = cluster(2, restarts=2)
    c.start({0: "run:30", 1: "crash:2:3"})  # exit code 3: the trainer's non-finite loss
    assert all(code != 0 for code in c.wait()), c.output()
    summary = c.json("summary.json")
    assert summary["cause"].endswith("not restarted: the loss became non-finite (exit code 3)")
    assert summary["restarts"] == 0
    # the step the refusals compare (the same rank at the same step: test_loop.py), from the
    # failed rank's last heartbeat
    assert (summary["failure"]["rank"], summary["failure"]["step"]) == (1, 2), summary["failure"]


def test_a_host_gone_is_left_out_and_the_others_go_on(cluster):
    """--min-hosts 2 of 3: h2's agent is killed with its rank (its container gone); h0 and h1
    restart without it, renumbered, and complete; the attempts say who and why."""
    c = cluster(3, restarts=1, **{"min-hosts": 2, "world-size": 3})
    c.part_path.write_text(json.dumps({"status": "completed", "world_size": 2}))
    c.start({0: "run:30", 1: "run:30", 2: "run:30", "0_R1": "run:3", "1_R1": "run:3"})
    c.heartbeat_ready(2, step=3)
    c.kill_host(2)
    assert c.wait()[:2] == [0, 0], c.output()
    progress = c.json("progress.json")
    assert (progress["status"], progress["restarts"]) == ("completed", 1), progress
    first, second = progress["attempts"]
    assert (first["hosts"], first["world_size"]) == (c.hosts, 3)
    assert (second["hosts"], second["world_size"]) == (["h0", "h1"], 2)
    assert second["cause"].startswith("run t1 failed: host h2"), second
    assert 0 < second["heal_sec"] < 20, second  # peer timeout 4 s, then the restart
    assert progress["hosts"]["h2"] == "left out"
    log = (c.run_dir / "nodes" / "h1.log").read_text()
    assert "restart 1 of 1 without h2 from the newest checkpoint" in log


def test_a_host_cut_off_and_back_rejoins_at_the_next_checkpoint(cluster):
    """h2 frozen past the peer timeout (as when cut off), then running again: h0 and h1 go on
    without it; h2's agent ends its ranks, asks to come back, and all three restart together
    at the next checkpoint ("saved" in the fake ranks' heartbeats) and complete."""
    c = cluster(3, restarts=1, **{"min-hosts": 2, "world-size": 3})
    c.part_path.write_text(json.dumps({"status": "completed", "world_size": 3}))
    c.start({0: "run:60", 1: "run:60", 2: "run:60", "0_R1": "run:60", "1_R1": "run:60",
             "0_R2": "run:5", "1_R2": "run:5", "2_R2": "run:5"})  # fmt: skip
    c.heartbeat_ready(2, step=3)
    c.freeze_host(2, 9)
    assert c.wait(90) == [0, 0, 0], c.output()
    progress = c.json("progress.json")
    assert (progress["status"], progress["restarts"]) == ("completed", 1), progress
    hosts = [a["hosts"] for a in progress["attempts"]]
    assert hosts == [c.hosts, ["h0", "h1"], c.hosts], progress["attempts"]
    back = progress["attempts"][2]
    assert back["cause"].startswith("h2 back: rejoined at the checkpoint of step "), back
    assert (back["world_size"], back["restart"]) == (3, 1)  # a regrow is no restart
    assert c.json("summary.json")["restarts"] == 1
    assert progress["hosts"] == {h: "exited" for h in c.hosts}
    log = (c.run_dir / "nodes" / "h2.log").read_text()
    assert "asks to come back" in log
    assert "back in the run at its generation 2" in log


def test_a_host_whose_agent_is_started_again_rejoins_at_the_next_checkpoint(cluster):
    """h2's container killed (its agent and rank), then started again (a restart policy, a
    re-run of train.yml): h0 and h1 go on without it; the new agent finds the host's keepalive
    in the store, asks to come back and starts with the others at the next checkpoint, its
    ranks told to resume (DDPFLEET_RESTART: the generation it joins)."""
    c = cluster(3, restarts=1, **{"min-hosts": 2, "world-size": 3})
    c.part_path.write_text(json.dumps({"status": "completed", "world_size": 3}))
    c.start({0: "run:60", 1: "run:60", 2: "run:60", "0_R1": "run:60", "1_R1": "run:60",
             "0_R2": "run:5", "1_R2": "run:5", "2_R2": "run:5"})  # fmt: skip
    c.heartbeat_ready(2, step=3)
    c.kill_host(2)
    c.wait_said(0, "restart 1 of 1 without h2", 60)
    c.start_again(2)
    assert c.wait(120) == [0, 0, 0], c.output()
    progress = c.json("progress.json")
    assert (progress["status"], progress["restarts"]) == ("completed", 1), progress
    hosts = [a["hosts"] for a in progress["attempts"]]
    assert hosts == [c.hosts, ["h0", "h1"], c.hosts], progress["attempts"]
    assert progress["attempts"][2]["cause"].startswith("h2 back: rejoined at the checkpoint")
    log = (c.run_dir / "nodes" / "h2.log").read_text()
    assert "started again in the run: it asks to come back" in log
    assert "back in the run at its generation 2" in log


def test_a_stop_while_a_host_waits_to_come_back_ends_every_agent(cluster):
    """stop.yml's SIGTERM to every agent while the run goes on without h2 and h2 asks to come
    back (no checkpoint comes: the ranks of the shrunk run stop stepping): h0 and h1 stop the
    run, h2's agent stops asking, and the run is recorded stopped."""
    c = cluster(3, restarts=1, **{"min-hosts": 2, "world-size": 3, "heartbeat-timeout": 60})
    c.start({0: "run:60", 1: "run:60", 2: "run:60", "0_R1": "hang", "1_R1": "hang"})
    c.heartbeat_ready(2, step=3)
    c.freeze_host(2, 9)
    c.wait_said(0, "asked to come back", 30)
    for agent in c.procs:
        agent.send_signal(signal.SIGTERM)
    codes = c.wait(30)
    assert codes[:2] == [143, 143], c.output()
    progress = c.json("progress.json")
    assert progress["status"] == "stopped", progress
    assert [a["hosts"] for a in progress["attempts"]] == [c.hosts, ["h0", "h1"]]
    assert c.json("nodes/h2.exit")["outcome"] == "left out"


CRASH = {"host": "h1", "rank": 1, "exit_code": 1, "reason": "x", "step": 7, "restartable": True}
GONE = {"host": "h2", "node_rank": 2, "rank": 2, "exit_code": None, "reason": "no keepalive",
        "gone": True}  # fmt: skip


@pytest.mark.parametrize(
    ("cause", "earlier", "allowed", "verdict"),
    [
        (CRASH, [], 2, None),
        (CRASH, [], 0, ""),  # restarts off: today's behaviour, nothing said
        ({**CRASH, "restartable": False}, [], 2, ""),  # a host gone, the store lost
        ({**CRASH, "exit_code": 2}, [], 2, "not restarted: bad input (exit code 2)"),
        (CRASH, [{**CRASH, "step": 3}, {**CRASH, "step": 5}], 2,
         "not restarted: all 2 restart(s) used"),
        (CRASH, [{**CRASH, "step": 5}], 2, None),  # another step: it made progress
        (CRASH, [{**CRASH, "rank": 0}], 2, None),  # another rank
        (CRASH, [CRASH], 2,
         "not restarted: rank 1 failed again at step 7 (a deterministic error)"),
        ({**CRASH, "step": None}, [{**CRASH, "step": None}], 2, None),  # step unknown
    ],
)  # fmt: skip
def test_restart_refusal(cause, earlier, allowed, verdict):
    assert restart_refusal(cause, earlier, allowed) == verdict


@pytest.mark.parametrize(
    ("cause", "members", "min_hosts", "verdict"),
    [
        (GONE, 3, 2, None),  # 2 of 3 remain: the run goes on without h2
        (GONE, 3, 0, ""),  # shrinking not asked for: a host gone ends the run, as before
        (GONE, 2, 2, "not restarted: 1 host(s) left, train_min_hosts is 2"),
        (GONE, 3, 3, "not restarted: 2 host(s) left, train_min_hosts is 3"),
        ({**GONE, "node_rank": 0}, 3, 2,
         "not restarted: the host of the run's store (node rank 0) is gone"),
        (CRASH, 3, 2, None),  # a rank's failure on a host still there: in place, as before
    ],
)  # fmt: skip
def test_restart_refusal_of_a_host_gone(cause, members, min_hosts, verdict):
    assert restart_refusal(cause, [], 2, members=members, min_hosts=min_hosts) == verdict
    if verdict is None:  # the restarts still count
        assert restart_refusal(cause, [CRASH, CRASH], 2, members=members, min_hosts=min_hosts)


class _Lead(Lead):
    """Node rank 0's watch as `Lead.regrow` sees it: h2 left out and asking to come back,
    the lead rank's heartbeat at `saved` of `total` steps."""

    def __init__(self, saved: int, total: int) -> None:
        self.said: list[str] = []
        cfg = SimpleNamespace(hosts=["h0", "h1", "h2"], host="h0")
        peers = SimpleNamespace(
            members=[0, 1], joins=lambda: [2], leads=True,
            views={0: {"ranks": [{"saved": saved, "total_steps": total}]}},
        )  # fmt: skip
        super().__init__(cfg, peers, self.said.append)

    def regrow_after(self, saved: int) -> dict | None:
        """regrow when h2 asks, then again once the ranks saved `saved`."""
        assert self.regrow(10.0) is None  # asked: waits for the next checkpoint
        self.peers.views[0]["ranks"][0]["saved"] = saved
        return self.regrow(10.0 + ASK_EVERY)


def test_a_host_is_taken_back_at_the_next_checkpoint_but_not_at_the_run_s_last_step():
    """The checkpoint after the last step comes as the ranks end the run: regrowing there would
    kill ranks that completed it and start a run with nothing left to train (the likely cause
    of a CI rehearsal's e2e failure, inferred without its logs: node3 relaunched late, the
    fifth start failed before any step)."""
    back = _Lead(saved=35, total=45).regrow_after(40)
    assert back["regrow"] == [2], back
    assert back["reason"] == "h2 back after the checkpoint of step 40"
    lead = _Lead(saved=40, total=45)
    assert lead.regrow_after(45) is None
    assert lead.said[-1] == "h2 not taken back: the run saved its last step (45)"
    assert lead.regrow(10.0 + 2 * ASK_EVERY) is None  # said once, not taken later
    assert len(lead.said) == 2


def test_a_host_taken_back_is_said_to_rejoin_at_the_checkpoint_its_restart_resumed_from(
    tmp_path, monkeypatch
):
    """Node rank 0 decides at the checkpoint its view shows (step 20), but the ranks may save
    again before they are ended (a CI run on a fast CPU: step 25): the restart's entry names the
    checkpoint it resumed from, as its ranks say, not the one the decision saw."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    agent = Agent(parse_args([
        "--run-dir", str(tmp_path), "--run-id", "t1", "--hosts", "h0,h1,h2", "--host", "h0",
        "--node-rank", "0", "--store", "127.0.0.1:1", "--attempt", "a1", "--key-file", "k",
        "--min-hosts", "2", "--", "true"]))  # fmt: skip
    agent.ranks.start = lambda command, env: None
    agent.peers.members = [0, 1, 2]
    back = _Lead(saved=15, total=400).regrow_after(20)
    assert back["reason"] == "h2 back after the checkpoint of step 20"
    agent.starts.start(back)
    assert agent.starts.attempts[-1]["cause"] == "h2 back: rejoined at the newest checkpoint"
    agent.peers.views = {0: {"ranks": [{"rank": 0, "phase": "start", "step": 25}]}}
    agent.starts.track(time.time())
    assert agent.starts.attempts[-1]["from_step"] == 25
    assert agent.starts.attempts[-1]["cause"] == "h2 back: rejoined at the checkpoint of step 25"
