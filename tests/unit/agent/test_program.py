"""The agent around a user's program (--program): its summary.json, and the standalone
heartbeat helper (ddpfleet_heartbeat) read by the agent's stall detection."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from time_bounds import within

from ddpfleet_agent import ddpfleet_heartbeat
from ddpfleet_agent.ranks import rank_views, read_heartbeats
from ddpfleet_agent.wire import SHAPES

HELPER_DIR = Path(ddpfleet_heartbeat.__file__).parent

# A user's rank that knows nothing of ddpfleet but the helper: steps until FAKE_<rank>'s
# "hang:<step>" (alive, no progress after it) or "run:<s>" seconds.
HELPER_RANK = f"""
import os, sys, time
sys.path.insert(0, {str(HELPER_DIR)!r})
import ddpfleet_heartbeat
rank = int(sys.argv[1])
mode = os.environ.get(f"FAKE_{{rank}}", "run:60").split(":")
beat = ddpfleet_heartbeat.start(total_steps=100, rank=rank, period=0.3)
deadline = time.time() + (float(mode[1]) if mode[0] == "run" else 120)
step = 0
while time.time() < deadline:
    if not (mode[0] == "hang" and step >= int(mode[1])):
        step += 1
        beat.step(step, loss=2.0, images_per_sec=5.0)
    time.sleep(0.2)
beat.stop()
"""


def test_program_summary_records_status_times_exits_and_tails(cluster):
    c = cluster(2, program="my_train.py", **{"world-size": 2})
    c.start({0: "run:2", 1: "run:2"})
    assert c.wait() == [0, 0], c.output()
    s = c.json("summary.json")
    assert (s["status"], s["program"], s["world_size"], s["attempt"]) == (
        "completed", "my_train.py", 2, "a1",
    )  # fmt: skip
    assert 1.5 < s["wall_time_sec"] < 30
    assert set(s["hosts"]) == {"h0", "h1"}
    for rec in s["hosts"].values():
        assert (rec["exit_code"], rec["outcome"]) == (0, "completed")
        assert any("node_rank" in line for line in rec["log_tail"]), rec


def test_program_failure_keeps_the_cause_and_records_every_exit(cluster):
    c = cluster(3, program="pkg.train", **{"world-size": 3})
    c.start({0: "run:60", 1: "exit:5:2", 2: "run:60"})
    codes = c.wait()
    assert all(code != 0 for code in codes), c.output()
    s = c.json("summary.json")
    assert s["status"] == "failed", s
    assert (s["failure"]["host"], s["failure"]["exit_code"]) == ("h1", 5)
    assert s["hosts"]["h1"]["outcome"] == "failed"
    assert s["hosts"]["h0"]["exit_code"] not in (0, None)


def test_an_earlier_attempts_failure_is_dropped_and_program_keys_kept(cluster):
    c = cluster(2, program="my_train.py", **{"world-size": 2})
    old = {"status": "failed", "attempt": "a0", "failure": {"host": "h1"}, "cause": "old",
           "accuracy": 0.5}  # fmt: skip
    (c.run_dir / "summary.json").write_text(json.dumps(old))
    c.start({0: "run:1", 1: "run:1"})
    assert c.wait() == [0, 0], c.output()
    s = c.json("summary.json")
    assert (s["status"], s["attempt"], s["accuracy"]) == ("completed", "a1", 0.5)
    assert "failure" not in s
    assert "cause" not in s


def test_helper_heartbeats_are_what_the_agent_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPFLEET_HEARTBEAT_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    beat = ddpfleet_heartbeat.start(total_steps=50, period=0.05)
    beat.step(7, loss=1.25, images_per_sec=99.0)
    beat.phase("validate")
    time.sleep(0.3)
    view = rank_views(read_heartbeats(tmp_path), time.time())
    assert len(view) == 1
    assert (view[0]["rank"], view[0]["step"], view[0]["total_steps"]) == (3, 7, 50)
    assert (view[0]["phase"], view[0]["loss"], view[0]["images_per_sec"]) == (
        "validate",
        1.25,
        99.0,
    )
    assert view[0]["live_age"] < 0.3
    beat.stop()
    assert read_heartbeats(tmp_path)[3]["phase"] == "done"


def test_a_program_writing_odd_values_still_gives_views_the_other_agents_take(tmp_path):
    """A user's program writes its own heartbeat: strings, NaN or infinity where numbers go
    become None or 0 in the store's view, so the other agents never ignore its host."""
    odd = ["7", True, math.nan, math.inf, [1], {"a": 1}, None]
    for i, value in enumerate(odd):
        beat = {k: value for k in ("step", "total_steps", "epoch", "loss", "images_per_sec")}
        beat |= {"rank": i, "time": value, "progress_time": value, "phase": "train"}
        (tmp_path / f"rank-{i}.json").write_text(json.dumps(beat))
    (tmp_path / "rank-9.json").write_text(json.dumps({"rank": True, "step": 1}))
    views = rank_views(read_heartbeats(tmp_path), time.time())
    assert [v["rank"] for v in views] == list(range(len(odd)))  # rank true is no rank
    assert SHAPES["ranks"]({"state": "running", "ranks": views})
    assert views[0]["step"] == 0  # "7" is not a step
    assert views[2]["loss"] is not None  # NaN is a number: the trainer stops on it itself


def test_helper_does_nothing_outside_a_run(tmp_path, monkeypatch):
    monkeypatch.delenv("DDPFLEET_HEARTBEAT_DIR", raising=False)
    beat = ddpfleet_heartbeat.start(total_steps=5, rank=0)
    beat.step(1)
    beat.stop()
    assert beat.path is None


def test_a_hang_in_a_helper_program_is_named(cluster):
    c = cluster(2, program="user.py", **{"heartbeat-timeout": 3, "world-size": 2})
    (c.tmp / "rank.py").write_text(HELPER_RANK)
    c.start({0: "run:60", 1: "hang:4"})
    t0 = time.monotonic()
    codes = c.wait()
    assert time.monotonic() - t0 < within(25), c.output()
    assert all(code != 0 for code in codes)
    s = c.json("summary.json")
    assert (s["failure"]["host"], s["failure"]["rank"]) == ("h1", 1), s
    assert "hung (no progress" in s["failure"]["reason"]
    assert "step 4" in s["failure"]["reason"]
