"""The run agent end to end on localhost: real agents, their real store, fake torchrun/ranks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from time_bounds import within

from ddpfleet_agent.cli import BadAgentInput, parse_args
from ddpfleet_agent.report import report_lines
from ddpfleet_agent.store import StoreClient, StoreError
from ddpfleet_agent.supervise import Agent
from ddpfleet_agent.wire import launch_key, seal


def test_completed_run_records_every_host_and_writes_the_report(cluster):
    c = cluster(3)
    # what trainer rank 0 hands over: its part of summary.json (the fake ranks write none)
    summary = {"status": "completed", "world_size": 3, "per_rank_images_per_sec": [9, 9, 4]}
    c.part_path.write_text(json.dumps(summary))
    (c.run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')
    c.start({0: "run:2", 1: "run:2", 2: "run:2"})
    assert c.wait() == [0, 0, 0], c.output()
    for host in c.hosts:
        rec = c.json(f"nodes/{host}.exit")
        assert (rec["outcome"], rec["exit_code"], rec["attempt"]) == ("completed", 0, "a1")
    progress = c.json("progress.json")
    assert (progress["state"], progress["status"]) == ("ended", "completed")
    assert progress["hosts"] == {h: "exited" for h in c.hosts}
    log = (c.run_dir / "nodes" / "h0.log").read_text()
    assert "node_rank 0 of 3" in log
    assert "report.txt and report.png written" in log
    table = (c.run_dir / "report.txt").read_text().splitlines()
    assert table == report_lines(summary, 0.9, c.hosts, 1)
    assert "STRAGGLER" in table[3]
    assert (c.run_dir / "report.png").read_bytes().startswith(b"\x89PNG")
    assert list(c.tmpdir.iterdir()) == []  # each agent removed its ranks' heartbeat files
    # nothing the agents wrote is world-readable (the logs carry the command line)
    written = [*(c.run_dir / "nodes").iterdir(), *(c.run_dir / n for n in ("progress.json",
               "report.txt", "report.png"))]  # fmt: skip
    assert {p.name: oct(p.stat().st_mode & 0o007) for p in written} == {
        p.name: "0o0" for p in written
    }


def test_a_late_host_is_waited_for_after_a_completed_run(cluster):
    """A loaded host's agent reports seconds late: node rank 0 waits for its exit (up to the
    peer timeout) instead of ending the run with that host still "running"."""
    c = cluster(3, **{"peer-timeout": 10, "heartbeat-timeout": 10})
    c.start({0: "run:4", 1: "run:4", 2: "run:4"})
    c.heartbeat_ready(2, step=1)
    os.kill(c.procs[2].pid, signal.SIGSTOP)  # h2's agent stalls; its rank runs on and exits
    try:
        time.sleep(6)  # h0 and h1 complete while h2 is silent for longer than the settle time
    finally:
        os.kill(c.procs[2].pid, signal.SIGCONT)
    assert c.wait() == [0, 0, 0], c.output()
    assert c.json("progress.json")["hosts"] == {h: "exited" for h in c.hosts}
    assert c.json("nodes/h2.exit")["outcome"] == "completed"


def test_values_of_another_shape_in_the_store_are_ignored_and_the_run_completes(cluster):
    """A store client that is not an agent writes a failure and a stop missing their fields,
    a host's rank views with a string where the ranks go, and an exit without its outcome:
    the agents name each key once in their logs and the run completes (before, the failure
    ended the run and the views raised out of every agent's loop)."""
    c = cluster(2)
    c.start({0: "run:8", 1: "run:8"})
    c.heartbeat_ready(0, step=1)
    client = StoreClient("127.0.0.1", c.port, 10)
    key = launch_key(c.key, "a1")  # sealed for this launch, so only their shape is wrong
    client.set("failure", seal(key, "failure", {"x": 1}))
    client.set("stop", seal(key, "stop", {"by": 5}))
    client.set("exit/1", seal(key, "exit/1", {"host": "h1"}))
    deadline = time.monotonic() + 3  # h1's agent rewrites ranks/1 every round
    while time.monotonic() < deadline:
        client.set("ranks/1", seal(key, "ranks/1", {"state": "running", "ranks": "xy"}))
        time.sleep(0.02)
    assert c.wait() == [0, 0], c.output()
    assert c.json("progress.json")["status"] == "completed"
    log = (c.run_dir / "nodes" / "h0.log").read_text()
    for key in ("failure", "stop", "exit/1", "ranks/1"):
        assert log.count(f"ignored the store's {key}: not what an agent writes") == 1, log


def test_forged_values_from_a_client_without_the_run_s_key_are_refused(cluster):
    """A client on the cluster network without the run's secret forges what agents write, in
    the right shape: a failure naming h1, a stop, h1's exit, and keepalives (a string, and a
    replay of one it saw); and values sealed for another launch of the run. The store refuses
    all but the replay, which the agents ignore (its count does not grow), and the run
    completes (before, the forged failure or stop ended it, and a string keepalive raised)."""
    c = cluster(2)
    c.start({0: "run:8", 1: "run:8"})
    c.heartbeat_ready(0, step=1)
    client = StoreClient("127.0.0.1", c.port, 10)
    forged = {
        "failure": {"host": "h1", "node_rank": 1, "rank": 1, "exit_code": 9, "reason": "forged"},
        "stop": {"by": "mallory", "time": time.time()},
        "exit/1": {"host": "h1", "outcome": "failed", "exit_code": 1, "attempt": "a1"},
    }
    earlier = launch_key(c.key, "a0")
    for key, value in forged.items():
        for raw in (json.dumps(value), seal(earlier, key, value), seal(c.key, key, value)):
            with pytest.raises(StoreError, match=f"the value of {key} is not sealed"):
                client.set(key, raw)
    seen = client.get("alive/1")  # a sealed keepalive of h1's, sent again below
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        with pytest.raises(StoreError, match="not sealed"):
            client.set("alive/0", "not a number")
        client.set("alive/1", seen or b"")
        time.sleep(0.05)
    assert c.wait() == [0, 0], c.output()
    assert c.json("progress.json")["status"] == "completed"
    for host in c.hosts:
        assert "failure" not in c.json(f"nodes/{host}.exit")


def test_an_error_of_the_agent_itself_fails_the_run_naming_its_host(cluster):
    """A defect in the agent (any exception out of its loop) ends the run as a failure naming
    that host, with the traceback in its log and in its host-local fallback's, and its ranks
    gone, as any failed host's."""
    c = cluster(2)
    local = c.tmp / "local"
    local.mkdir()
    c.options["fallback-dir"] = str(local)
    c.start({0: "run:60", 1: "run:60"}, defects={1: "_check"})
    codes = c.wait()
    assert codes[1] == 1, (codes, c.output())
    assert codes[0] != 0, (codes, c.output())
    summary = c.json("summary.json")
    assert summary["failure"]["host"] == "h1", summary
    assert (
        "its ddpfleet agent failed (KeyError: 'a defect planted by the test')" in (summary["cause"])
    )
    assert c.json("nodes/h1.exit")["outcome"] == "failed"
    log = (c.run_dir / "nodes" / "h1.log").read_text()
    assert "Traceback (most recent call last)" in log
    assert "_crashed" not in log  # the handler's own frames are not part of the defect
    assert "Traceback (most recent call last)" in (local / "h1.log").read_text()
    assert json.loads((local / "h1.exit").read_text())["failure"]["host"] == "h1"
    deadline = time.monotonic() + 5
    while (left := processes_under(c.tmp)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"launchers or ranks outlived their agents: {left}"
    assert list(c.tmpdir.iterdir()) == []  # the failed agent removed its heartbeat files too


def processes_under(folder: Path) -> list[str]:
    """Command lines of running processes that name a file in folder (launcher.py, rank.py)."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes()
            if proc.name.isdigit() and str(folder).encode() in cmdline:
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_a_killed_rank_is_named_though_a_peer_that_lost_it_exited_first(cluster):
    """A user program's rank that loses its peer raises at once: its host's exit can come
    before the killed rank's own torchrun reports. The killed rank is the cause (CI saw
    node1 rank 0 named for node3's rank 2 killed with SIGKILL, when the first claim won)."""
    c = cluster(3)
    c.start({0: "exit:1:4", 1: "killed:5", 2: "run:60"}, t0=time.time())
    c.wait()
    failure = c.json("summary.json")["failure"]
    assert (failure["host"], failure["rank"], failure["exit_code"]) == ("h1", 1, -9), failure
    assert failure["reason"] == "rank 1 killed by SIGKILL (exit code -9)"
    assert failure["claimed_by"] == "h0", c.output()  # h0 saw both exits and named h1's


def test_failed_rank_ends_every_host_and_names_it(cluster):
    c = cluster(3)
    c.start({0: "run:60", 1: "exit:3:2", 2: "run:60"})
    t0 = time.monotonic()
    codes = c.wait()
    assert time.monotonic() - t0 < within(20), c.output()
    assert all(code != 0 for code in codes), (codes, c.output())
    summary = c.json("summary.json")
    assert summary["status"] == "failed"
    assert (summary["failure"]["host"], summary["failure"]["rank"]) == ("h1", 1)
    assert summary["failure"]["exit_code"] == 3
    assert summary["cause"].startswith("run t1 failed: host h1 rank 1: rank 1 exited with code 3")
    assert c.json("nodes/h0.exit")["outcome"] == "failed"
    assert (c.json("progress.json")["state"], c.json("progress.json")["status"]) == (
        "ended", "failed",
    )  # fmt: skip
    assert not (c.run_dir / "report.txt").exists()


def test_dead_host_is_named_by_the_others(cluster):
    c = cluster(3, **{"peer-timeout": 3})
    c.start({0: "run:60", 1: "run:60", 2: "run:60"})
    c.heartbeat_ready(1, step=2)
    c.kill_host(1)  # the whole container gone: nobody reports for h1
    killed = time.monotonic()
    c.procs[0].wait(within(30))
    c.procs[2].wait(within(30))
    assert time.monotonic() - killed < within(3 + 8), c.output()
    failure = c.json("summary.json")["failure"]
    assert failure["host"] == "h1", failure
    assert "keepalive" in failure["reason"]
    assert c.json("progress.json")["status"] == "failed"  # no exit record of h1 needed


def test_frozen_rank_is_named_not_its_peers(cluster):
    c = cluster(2, **{"heartbeat-timeout": 3})
    c.start({0: "run:60", 1: "run:60"})
    c.heartbeat_ready(1, step=2)
    rank_pid = c.rank_pid(1)
    os.kill(rank_pid, signal.SIGSTOP)
    try:
        c.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the agent SIGKILLs it: gone already
            os.kill(rank_pid, signal.SIGCONT)
    failure = c.json("summary.json")["failure"]
    assert (failure["host"], failure["rank"]) == ("h1", 1), failure
    assert "frozen" in failure["reason"]
    # the forensics bundle, taken before the kill: both ranks' stacks, the stopped one named
    bundle = c.run_dir / "forensics" / "a1"
    assert sorted(f.name for f in bundle.iterdir()) == [
        "index.json", "rank-0.json", "rank-0.txt", "rank-1.json", "rank-1.txt"]  # fmt: skip
    index = c.json("forensics/a1/index.json")
    assert "rank 1 (h1) is stopped (process state T) in " in index["diagnosis"], index
    assert c.json("summary.json")["diagnosis"] == index["diagnosis"]
    assert "process state T" in (bundle / "rank-1.txt").read_text()


def test_a_host_paused_whole_is_not_a_frozen_rank(cluster):
    """h1's agent and its ranks stopped together for twice the heartbeat timeout (a paused VM
    or container, a host stalled in swap), then running on, within the peer timeout: its ranks'
    silence was its agent's own pause (awake.py). Nothing is claimed, nothing restarts, and the
    run completes. Before, h1 woke to its ranks' heartbeats 7 s old and failed the run with
    "rank 1 frozen" (with restarts, it restarted every host). A rank frozen alone is named:
    the test above."""
    c = cluster(2, **{"heartbeat-timeout": 3, "peer-timeout": 20})
    c.start({0: "run:14", 1: "run:14"})
    c.heartbeat_ready(1, step=2)
    c.freeze_host(1, 7)
    assert c.wait(40) == [0, 0], c.output()
    progress = c.json("progress.json")
    assert (progress["status"], progress["restarts"]) == ("completed", 0), progress
    log = (c.run_dir / "nodes" / "h1.log").read_text()
    assert "frozen" not in log, log


def test_a_rank_that_finished_may_take_longer_than_the_heartbeat_timeout_to_exit(cluster):
    # the trainer's last heartbeat says "done"; its exit can take seconds more on a busy host
    # (CI saw 4 s after a stop): no "frozen" failure for that, within the stop timeout
    c = cluster(2, **{"heartbeat-timeout": 2, "stop-timeout": 30})
    c.start({0: "done:5", 1: "done:5"})
    assert c.wait(40) == [0, 0], c.output()
    assert c.json("nodes/h1.exit")["outcome"] == "completed"


def test_a_finished_rank_that_never_exits_fails_after_the_stop_timeout(cluster):
    c = cluster(2, **{"heartbeat-timeout": 2, "stop-timeout": 4})
    c.start({0: "run:60", 1: "done:60"})
    t0 = time.monotonic()
    codes = c.wait(within(40))
    assert all(code != 0 for code in codes), (codes, c.output())
    assert time.monotonic() - t0 < within(4 + 15), c.output()
    failure = c.json("summary.json")["failure"]
    assert (failure["host"], failure["rank"]) == ("h1", 1), failure
    assert "did not exit" in failure["reason"]


def test_hang_names_the_rank_whose_step_stopped_first(cluster):
    # both ranks alive; rank 0 stops progressing at step 3, rank 1 at step 4
    c = cluster(2, **{"heartbeat-timeout": 3})
    c.start({0: "hang", 1: "hang"})
    c.wait(40)
    failure = c.json("summary.json")["failure"]
    assert (failure["host"], failure["rank"]) == ("h0", 0), failure
    assert "hung" in failure["reason"]
    assert "step 3" in failure["reason"]
    index = c.json("forensics/a1/index.json")
    assert [(r["rank"], r["host"], r["state"]) for r in index["ranks"]] == [
        (0, "h0", "S"), (1, "h1", "S")]  # fmt: skip
    assert index["missing"] == {}


def test_sigterm_to_one_agent_stops_every_host_the_ranks_started_after_it_too(cluster):
    """h1's agent gets SIGTERM while h0's launcher has not started its rank yet (torchrun in its
    rendezvous): h0 SIGTERMs the rank once it is there, not SIGKILLs it at the stop timeout, and
    judges no peer while it stops (h1's ranks, ended, age past the heartbeat timeout)."""
    c = cluster(2, **{"stop-timeout": 10})
    c.start({0: "stoppable", 1: "stoppable", "SPAWN_AFTER_0": "5"})
    c.heartbeat_ready(1, step=2)
    c.procs[1].send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert c.wait(30) == [143, 143], c.output()
    assert time.monotonic() - t0 < within(6), c.output()  # not the stop timeout's 10 s
    assert c.json("nodes/h0.exit")["outcome"] == "stopped"
    assert c.json("progress.json")["status"] == "stopped"
    log = (c.run_dir / "nodes" / "h0.log").read_text()
    assert "stop requested by h1: SIGTERM to ranks []" in log
    assert "SIGTERM to ranks started after the stop" in log
    assert "SIGKILL" not in log


def test_stop_escalates_to_sigkill_after_the_stop_timeout(cluster):
    c = cluster(2, **{"stop-timeout": 2})
    c.start({0: "deaf", 1: "deaf"})
    c.heartbeat_ready(1, step=2)
    t0 = time.monotonic()
    c.procs[0].send_signal(signal.SIGTERM)
    assert c.wait(within(30)) == [143, 143], c.output()
    assert time.monotonic() - t0 < within(2 + 8)
    summary = c.json("summary.json")
    assert (summary["status"], summary["stopped_by"]) == ("stopped", "agent")


def test_unreachable_store_fails_with_one_line(tmp_path):
    (tmp_path / "agent.key").write_text("k" * 64)
    args = [sys.executable, "-m", "ddpfleet_agent", "--run-dir", str(tmp_path), "--run-id", "t",
            "--host", "b", "--node-rank", "1", "--hosts", "a,b", "--store", "127.0.0.1:1",
            "--key-file", str(tmp_path / "agent.key"), "--peer-timeout", "1",
            "--", "true"]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert "cannot reach the run's store at 127.0.0.1:1" in proc.stdout


def test_bad_command_line_is_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "ddpfleet_agent", "--run-dir", "/tmp", "--", "true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.startswith("ddpfleet_agent: error:")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_parse_args_checks_host_and_rank():
    base = ["--run-dir", "d", "--run-id", "r", "--hosts", "a,b", "--store", "x:1"]  # fmt: skip
    base += ["--key-file", "k"]
    cfg = parse_args([*base, "--host", "b", "--node-rank", "1", "--", "cmd", "-x"])
    assert (cfg.node_rank, cfg.command, cfg.store_port) == (1, ["cmd", "-x"], 1)
    for bad in (["--host", "c", "--node-rank", "0"], ["--host", "a", "--node-rank", "1"]):
        try:
            parse_args([*base, *bad, "--", "cmd"])
        except BadAgentInput:
            continue
        raise AssertionError(bad)


def test_store_that_stops_answering_counts_as_its_host_failing(cluster):
    # node rank 0's agent frozen: the store's socket stays open but answers nothing (as when
    # a DROP rule cuts the host off); the other agent must not wait for TCP to give up.
    c = cluster(2, **{"peer-timeout": 4})
    c.start({0: "run:120", 1: "run:120"})
    c.rank_pid(1)
    os.kill(c.procs[0].pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        c.procs[1].wait(within(4 + 20))
        took = time.monotonic() - t0
        # node rank 0's agent wrote nothing meanwhile: h1 said in its place how the run ended
        progress = c.json("progress.json")
        summary = c.json("summary.json")
    finally:
        os.kill(c.procs[0].pid, signal.SIGCONT)
    assert took < within(4 + 20)
    ended = c.json("nodes/h1.exit")
    assert ended["outcome"] == "failed"
    assert ended["failure"]["host"] == "h0", ended
    assert "no answer from the store" in ended["failure"]["reason"]
    assert (progress["state"], progress["status"], progress["attempt"]) == ("ended", "failed", "a1")
    assert (summary["status"], summary["failure"]["host"]) == ("failed", "h0"), summary
    assert summary["cause"].startswith("run t1 failed: host h0 rank 0: "), summary


def test_a_host_that_lost_the_store_stands_in_for_node_rank_0_only_when_it_is_gone(
    tmp_path, monkeypatch
):
    """progress.json rewritten meanwhile: node rank 0's agent lives (this host is the one cut
    off) and will write the status word itself; unchanged: it is gone, this host writes it."""

    args = ["--run-dir", str(tmp_path), "--run-id", "t1", "--hosts", "h0,h1", "--host", "h1",
            "--node-rank", "1", "--store", "127.0.0.1:1", "--attempt", "a1", "--key-file", "k",
            "--", "true"]  # fmt: skip
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the agent's heartbeat directory
    agent = Agent(parse_args(args))
    path = tmp_path / "progress.json"
    path.write_text(
        json.dumps({"attempt": "a1", "state": "running", "status": "running", "step": 7})
    )
    agent.ending._stand_in_for_rank0({"attempt": "a1", "state": "running", "step": 6})
    assert agent.records.flush(5)
    assert json.loads(path.read_text())["status"] == "running"
    agent.ending._stand_in_for_rank0(json.loads(path.read_text()))
    assert agent.records.flush(5)
    rec = json.loads(path.read_text())
    assert (rec["state"], rec["status"], rec["step"], rec["attempt"]) == (
        "ended",
        "failed",
        7,
        "a1",
    )
