"""Losing the host of the run's store (``--addresses``, failover.py): real agents on loopback,
each host on an address of its own (127.0.0.1-3, one port), lose node rank 0's agent for real
(SIGKILL, or frozen as when cut off) and go on under another host's store."""

from __future__ import annotations

import json
import os
import tempfile
import time

import pytest
from test_records import release_fifo
from time_bounds import within

from ddpfleet_agent.cli import BadAgentInput, parse_args
from ddpfleet_agent.machine import Standing
from ddpfleet_agent.membership import StoreLost
from ddpfleet_agent.peers import Peers
from ddpfleet_agent.restarts import regrouped
from ddpfleet_agent.store import StoreClient, StoreServer
from ddpfleet_agent.supervise import Agent
from ddpfleet_agent.wire import admits, launch_key, seal

ADDRESSES = "127.0.0.1,127.0.0.2,127.0.0.3"
SHRINKS = {"min-hosts": 2, "world-size": 3, "addresses": ADDRESSES}


def completed_summary(c) -> None:
    """What trainer rank 0 leaves behind at the end of the last start (fake ranks write none)."""
    c.part_path.write_text(json.dumps({"status": "completed", "world_size": 2}))


def test_node_rank_0_s_host_killed_the_next_host_serves_the_store_and_takes_it_back(cluster):
    """h0's agent killed: h1 serves the store and h1, h2 go on. h0's agent started again (a
    restart policy, a re-run of train.yml) finds the run gone on under h1's store, not its own,
    asks to come back and is taken back at the next checkpoint; all three complete."""
    c = cluster(3, restarts=1, **SHRINKS)
    completed_summary(c)
    c.start({0: "run:60", 1: "run:60", 2: "run:60", "1_R1": "run:60", "2_R1": "run:60",
             "0_R2": "run:5", "1_R2": "run:5", "2_R2": "run:5"})  # fmt: skip
    c.heartbeat_ready(0, step=3)
    c.kill_host(0)
    c.wait_said(2, "the run's store now on h1", within(60))
    time.sleep(2)  # h1 and h2 train in generation 1
    c.start_again(0)
    assert c.wait(60) == [0, 0, 0], c.output()
    progress = c.json("progress.json")  # written by h1's agent, the store's host from then on
    assert (progress["status"], progress["restarts"]) == ("completed", 1), progress
    first, second, back = progress["attempts"]
    assert (first["hosts"], second["hosts"], back["hosts"]) == (c.hosts, ["h1", "h2"], c.hosts)
    assert second["world_size"] == 2
    assert second["cause"].startswith("run t1 failed: host h0 rank 0: lost the connection to the"
                                      " run's store on h0"), second  # fmt: skip
    assert 0 < second["heal_sec"] < 20, second  # from the loss seen to the first step again
    assert back["cause"].startswith("h0 back: rejoined at the checkpoint of step "), back
    assert (back["world_size"], back["restart"]) == (3, 1)  # a regrow is no restart
    for host in ("h1", "h2"):
        log = (c.run_dir / "nodes" / f"{host}.log").read_text()
        assert (
            "restart 1 of 1 without h0 from the newest checkpoint, the run's store now on h1" in log
        )
    log = (c.run_dir / "nodes" / "h0.log").read_text()
    assert "started again in the run: it asks to come back" in log
    assert "back in the run at its generation 2" in log
    summary = c.json("summary.json")
    assert (summary["status"], len(summary["attempts"])) == ("completed", 3)


def test_node_rank_0_s_host_cut_off_rejoins_and_serves_the_store_once_its_successor_is_lost(
    cluster,
):
    """h0's agent and its ranks frozen past the peer timeout (a paused VM; to the others, a
    host cut off): h1 serves the store and h1, h2 go on; h0, running again, stops serving its
    store (it finds every other host silent, or its own pause past the peer timeout: awake.py),
    or, its own store call timed out first, follows the run to h1's store; either way it is
    taken back at the next checkpoint. Its ranks' silence over the pause is no frozen rank.
    Then h1, the store's host now, is killed: h0, the lowest-ranked member left, serves the
    store again and h0, h2 complete. h0 writes the run's records with every start, those it
    was out of too (the welcome's record)."""
    c = cluster(3, restarts=2, **SHRINKS)
    completed_summary(c)
    c.start({0: "run:60", 1: "run:60", 2: "run:60", "1_R1": "run:60", "2_R1": "run:60",
             "0_R2": "run:60", "1_R2": "run:60", "2_R2": "run:60",
             "0_R3": "run:5", "2_R3": "run:5"})  # fmt: skip
    c.heartbeat_ready(0, step=3)
    c.freeze_host(0, 10)
    c.wait_said(0, "back in the run at its generation 2", within(90))
    time.sleep(2)  # its ranks run in generation 2
    c.kill_host(1)
    assert c.wait(90) == [0, -9, 0], c.output()
    progress = c.json("progress.json")  # written by h0's agent, the store's host again
    hosts = [a["hosts"] for a in progress["attempts"]]
    assert hosts == [c.hosts, ["h1", "h2"], c.hosts, ["h0", "h2"]], progress["attempts"]
    back, without = progress["attempts"][2:]
    assert back["cause"].startswith("h0 back: rejoined at the checkpoint"), back
    assert without["cause"].startswith("run t1 failed: host h1 rank 1: lost the connection to"
                                       " the run's store on h1"), without  # fmt: skip
    assert (progress["status"], progress["restarts"]) == ("completed", 2), progress
    assert [a["restart"] for a in progress["attempts"]] == [0, 1, 1, 2]
    assert progress["hosts"]["h1"] == "left out"
    summary = c.json("summary.json")
    assert (summary["status"], len(summary["attempts"])) == ("completed", 4), summary
    log = (c.run_dir / "nodes" / "h0.log").read_text()
    stepped_aside = ("stops serving the store", "left out of the restarted run")
    assert any(line in log for line in stepped_aside), log
    assert "frozen" not in log, log
    assert "restart 2 of 2 without h1 from the newest checkpoint, the run's store now on h0" in log


def test_node_rank_0_and_its_successor_killed_at_once_the_next_host_serves_the_store(cluster):
    """h0's and h1's agents killed together (their containers killed, their agents crashed):
    h1 never serves the store it would take over and its host refuses the
    store's port, so after the follow's bound h2, the next in node rank order, serves it; h2
    and h3 go on without both (min-hosts 2). Before, h2 and h3 ended as left out, healthy,
    with the run's records still saying it ran."""
    c = cluster(4, restarts=1, **{**SHRINKS, "world-size": 4, "addresses": ADDRESSES + ",127.0.0.4",
                                  "dump-timeout": 0})  # fmt: skip
    completed_summary(c)
    c.start({0: "run:60", 1: "run:60", 2: "run:60", 3: "run:60", "2_R1": "run:5", "3_R1": "run:5"})
    c.heartbeat_ready(0, step=3)
    c.kill_host(0)
    c.kill_host(1)
    assert c.wait(90) == [-9, -9, 0, 0], c.output()
    progress = c.json("progress.json")  # written by h2's agent, the store's host from then on
    assert (progress["status"], progress["restarts"]) == ("completed", 1), progress
    first, without = progress["attempts"]
    assert (first["hosts"], without["hosts"], without["world_size"]) == (c.hosts, ["h2", "h3"], 2)
    assert without["cause"].startswith("run t1 failed: host h0 rank 0: lost the connection to the"
                                       " run's store on h0"), without  # fmt: skip
    # the follow's bound (peer timeout 4 + kill wait 10 s); the regroup does not wait for h1
    assert 0 < without["heal_sec"] < within(25), without
    assert progress["hosts"]["h0"] == progress["hosts"]["h1"] == "left out", progress["hosts"]
    for host in ("h2", "h3"):
        log = (c.run_dir / "nodes" / f"{host}.log").read_text()
        moved = "h1 does not serve the run's store (no store at 127.0.0.2 within 14s) and its host"
        assert f"{moved} refuses the store's port: the run's store now on h2" in log, log
    assert c.json("summary.json")["status"] == "completed"


def test_regrouped_names_the_first_member_s_host_as_torchrun_s_master():
    cmd = ["torchrun", "--nnodes=3", "--node-rank=2", "--master-addr=10.0.0.1",
           "--master-port=29500", "-m", "trainer", "--master-addr=kept"]  # fmt: skip
    assert regrouped(cmd, 2, 1, "10.0.0.2") == [
        "torchrun", "--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.2",
        "--master-port=29500", "-m", "trainer", "--master-addr=kept",
    ]  # fmt: skip
    assert regrouped(cmd, 2, 1)[3] == "--master-addr=10.0.0.1"  # no addresses: left alone


BASE = ["--run-dir=/r", "--run-id=r", "--host=a", "--node-rank=0", "--hosts=a,b",
        "--store=10.0.0.1:1", "--key-file=/k"]  # fmt: skip


@pytest.mark.parametrize(
    ("addresses", "expected"),
    [(None, []), ("10.0.0.1,10.0.0.2", ["10.0.0.1", "10.0.0.2"]), ("[::1],[::2]", ["::1", "::2"])],
)
def test_addresses_are_read_in_node_rank_order(addresses, expected):
    extra = [f"--addresses={addresses}"] if addresses else []
    assert parse_args([*BASE, *extra, "--", "true"]).addresses == expected


def test_addresses_must_name_every_host():
    with pytest.raises(BadAgentInput, match="must name one address for each of the 2 hosts"):
        parse_args([*BASE, "--addresses=10.0.0.1", "--", "true"])


def _follower(port: int):
    """h2's Peers (node rank 2 of 3, --addresses), as after losing h0's store."""
    args = ["--run-dir", "/nonexistent", "--run-id", "t1", "--hosts", "h0,h1,h2", "--host", "h2",
            "--node-rank", "2", "--store", f"127.0.0.1:{port}", "--addresses", ADDRESSES,
            "--attempt", "a1", "--key-file", "k", "--", "true"]  # fmt: skip
    return Peers(parse_args(args), lambda _line: None)


@pytest.mark.wallclock
def test_a_host_cut_off_stops_following_once_the_lost_store_answers_again():
    """h2 lost h0's store and follows h1, which serves none (h0 was not lost: h2 was the one
    cut off). As soon as h0's store answers with its leader record, h2 stops waiting for h1 and
    looks for the run as a host left out does, instead of waiting out the follow's deadline."""
    key = launch_key(b"s" * 64, "a1")
    server = StoreServer("127.0.0.1", 0, admits(key))
    try:
        StoreClient("127.0.0.1", server.port, 5).set(
            "leader", seal(key, "leader", {"node": 0, "generation": 0})
        )
        peers = _follower(server.port)
        peers.key = key
        began = time.monotonic()
        with pytest.raises(StoreLost, match="h0 serves the run's store: this host was cut off"):
            peers.follow(1, 30, 0)
        assert time.monotonic() - began < within(5)  # not the 30 s deadline
    finally:
        server.close()
    peers = _follower(server.port)  # nothing serves at all now: it waits out the deadline
    began = time.monotonic()
    with pytest.raises(StoreLost, match=r"no store at 127\.0\.0\.2"):
        peers.follow(1, 2, 0)
    assert 2 <= time.monotonic() - began < within(6)


def test_a_host_let_back_in_restarts_at_the_run_s_next_generation(tmp_path, monkeypatch):
    """h2 was out of generation 1 (cut off) and let back in at generation 2. The run's next
    generations are 3 (new shares) and 4 (h1 lost), as for the hosts that never left: not its
    own count of starts (2 then 3), which regrouped it with the generation it was already in
    (in the sandbox: its ranks started for the three hosts of generation 2, and the run failed).
    It counts the run's restarts and starts as the store's host does (the welcome's): the
    restart that left it out, not the failovers of its own it tried when it was the one cut
    off. No process: the store's answers are those the regroup would get."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    agent = Agent(parse_args([
        "--run-dir", str(tmp_path), "--run-id", "t1", "--hosts", "h0,h1,h2", "--host", "h2",
        "--node-rank", "2", "--store", "127.0.0.1:1", "--attempt", "a1", "--key-file", "k",
        "--world-size", "3", "--min-hosts", "2", "--restarts", "2", "--", "true"]))  # fmt: skip
    agent.ranks.start = lambda command, env: None
    asked = []

    def regroup(generation, within, left_out, joining=None):
        asked.append((generation, left_out))
        agent.peers.generation = generation
        agent.peers.members = [n for n in (0, 1, 2) if n not in left_out]
        return {"nodes": agent.peers.members, "missing": []}

    agent.peers.regroup = regroup
    said = []
    agent.starts.say = said.append
    agent.starts.start()  # generation 0
    # its own count: the failovers it tried while it was the one cut off (h0's store lost to
    # it, then h1's, which served none) ...
    agent.starts.causes = [{"host": h, "reason": "lost the connection to the run's store"}
                           for h in ("h0", "h1")]  # fmt: skip
    # ... and the run's, as the store's host counted it: one restart, without h2
    left_out = {"host": "h2", "reason": "no keepalive from its agent for 10s", "gone": True}
    run = [{**agent.starts.attempts[0], "started": 5.0}, {"hosts": ["h0", "h1"], "restart": 1}]
    back = {"generation": 2, "nodes": [0, 1, 2], "causes": [left_out], "attempts": run}
    assert agent.heal._back(back, Standing(left_out=True))[0]
    assert agent.starts.restarts == 1
    # ... and its starts: the run's, which it would write should it come to serve the store
    assert [a["hosts"] for a in agent.starts.attempts] == [["h0", "h1", "h2"], ["h0", "h1"],
                                                          ["h0", "h1", "h2"]]  # fmt: skip
    assert agent.starts.began() == 5.0
    new_shares = {"reason": "new shares after the checkpoint of step 60", "host": "h2",
                  "rebalance": {"h0": 1.0, "h1": 1.0, "h2": 0.5}}  # fmt: skip
    assert agent.heal.regrown(Standing(failure=new_shares))[0]
    lost = {"reason": "no keepalive from its agent for 10s", "host": "h1", "node_rank": 1,
            "rank": 1, "gone": True}  # fmt: skip
    assert agent.starts.restarted(Standing(failure=lost))[0]
    assert asked == [(2, []), (3, []), (4, [1])]
    assert agent.starts.attempts[-1]["hosts"] == ["h0", "h2"]
    assert agent.starts.restarts == 2
    assert said[-1].startswith("restart 2 of 2 without h1 from the newest checkpoint after: ")


@pytest.mark.parametrize(
    ("node", "h1", "expected"),
    [  # h1: its host refuses ("gone"), does not answer ("silent"), refuses and the run ended
        # ("ended"), refuses with train_min_hosts 3 ("short"); expected: the stores this host
        # followed, took over (its generation), went on
        (3, "gone", ([1, 2], [], True)),  # h1's agent gone: the run goes on under h2's store
        (2, "gone", ([1], [1], True)),  # h1's agent gone: h2 serves the store
        (3, "silent", ([1], [], False)),  # maybe a cut between h0, h1 and h3
        (3, "ended", ([1], [], False)),  # stopped while h3 was cut off: it ends, serves nothing
        (3, "unread", ([1], [], False)),  # progress.json does not answer: no store, no start
        (3, "short", ([1], [], False)),  # h2 and h3 left, min 3: the run fails
    ],
)
def test_a_successor_is_passed_over_only_when_its_host_refuses_the_store_s_port(
    tmp_path, monkeypatch, node, h1, expected
):
    """Node rank 0's store lost, and h1, next in line, serves none within the follow's bound.
    Where h1's host refuses the store's port (up, its agent gone), h1 counts as lost too and
    the next host serves the store; the hosts regroup without both. Not when progress.json says
    the run ended (a stop while this host was cut off: no agent serves any store, and this one
    must not start the run again alone), nor when too few hosts would be left: the run fails.
    Where h1 does not answer at all, h0 and h1 may be on the other side of a cut and go on
    there: this host looks for the run as one left out, and no second run starts on this
    side. No process: the store's answers are stand-ins."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    agent = Agent(parse_args([
        "--run-dir", str(tmp_path), "--run-id", "t1", "--hosts", "h0,h1,h2,h3", "--host",
        f"h{node}", "--node-rank", str(node), "--store", "127.0.0.1:1", "--attempt", "a1",
        "--key-file", "k", "--world-size", "4", "--min-hosts", "3" if h1 == "short" else "2",
        "--restarts", "1", "--addresses", "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4", "--", "true",
    ]))  # fmt: skip
    refused, ended, fails = h1 != "silent", h1 == "ended", h1 == "short"
    state = "ended" if ended else "running"
    progress = tmp_path / "progress.json"
    if h1 == "unread":  # opening it for reading blocks, as on storage that does not answer
        os.mkfifo(progress)
        agent.records.read_timeout = 0.3
    else:
        progress.write_text(json.dumps({"attempt": "a1", "state": state}))
    agent.records.storage_silent = True  # a read while it was cut off timed out
    follows, asked, took, regroups = [], [], [], []

    def follow(new, within, lost):
        follows.append(new)
        if new == 1:
            raise StoreLost(f"no store at 10.0.0.2 within {within:g}s")

    def regroup(generation, standing, cause, left_out):
        regroups.append((generation, left_out))
        return True, standing

    agent.peers.follow, agent.peers.take_over = follow, took.append
    agent.peers.refuses = lambda n: asked.append(n) or refused
    agent.starts.regroup = regroup
    said = []
    agent.heal.say = said.append
    lost = {"host": "h0", "reason": "lost the connection to the run's store on h0"}
    try:
        went_on, standing = agent.heal.failed_over(Standing(failure=lost))
    finally:
        if h1 == "unread":  # let the reader left waiting go
            release_fifo(progress, os.O_WRONLY)
    assert (follows, took, went_on) == expected
    assert asked == [1]
    assert standing.left_out is not (went_on or fails)
    assert regroups == ([(1, [0, 1])] if went_on else [])  # without h0 and h1: no wait for h1
    assert said[0].startswith("h1 does not serve the run's store (no store at 10.0.0.2 within ")
    refusal = " and its host refuses the store's port: "
    assert said[0].endswith(refusal + "the run's store now on h2") is went_on
    assert said[0].endswith(": the run has ended without this host") is ended
    unknown = ": its shared storage does not answer: it cannot tell whether the run goes on"
    assert said[0].endswith(unknown) is (h1 == "unread")
    short = "2 host(s) left, train_min_hosts is 3"
    assert said[0].endswith(refusal + short) is fails
    reason = f"{lost['reason']}; not restarted: {short}" if fails else lost["reason"]
    assert standing.failure["reason"] == reason
