"""summary.json has one writer, the agent that ends the run, and is written once, whole: the
trainer hands its part over (summary.trainer.json), the agent merges it with the run's end
and its attempts (issue 51 part 5)."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ddpfleet_agent import ending
from ddpfleet_agent.cli import parse_args
from ddpfleet_agent.machine import Standing
from ddpfleet_agent.records import Records
from ddpfleet_agent.summary import (
    SUMMARY,
    TRAINER_PART,
    merge,
    merge_base,
    write_trainer_summary,
)
from ddpfleet_agent.supervise import Agent

ATTEMPTS = [{"attempt": "a2", "restart": 0, "hosts": ["h0", "h1"]}]
PART = {"status": "completed", "world_size": 2, "steps": 6, "wall_time_sec": 3.2}
FAILURE = {"host": "h1", "rank": 1, "exit_code": 1, "reason": "rank 1 exited with code 1"}


class Watcher:
    """Reads summary.json in a tight loop (about every millisecond) while a run ends, and
    keeps each distinct text it saw, in order."""

    def __init__(self, path: Path) -> None:
        self.path, self.seen, self._done = path, [], threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.is_set():
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                text = None
            if text is not None and (not self.seen or self.seen[-1] != text):
                self.seen.append(text)
            time.sleep(0.001)

    def stop(self) -> list[dict]:
        self._done.set()
        self._thread.join(5)
        return [json.loads(text) for text in self.seen]  # a torn text fails here


@pytest.mark.parametrize(
    ("options", "modes"),
    [
        ({}, {0: "run:2", 1: "run:2"}),
        # restarted in place: rank 0 hands a part over at the end of each start it ends itself
        ({"restarts": 1}, {0: "run:20", 1: "crash:3:1", "0_R1": "run:2", "1_R1": "run:2"}),
        ({"program": "train.py", "world-size": 2}, {0: "run:2", 1: "run:2"}),
    ],
    ids=["completed", "restarted-in-place", "program"],
)
def test_summary_appears_once_whole_with_its_status_and_attempts(cluster, options, modes):
    c = cluster(2, **options)
    if "program" not in options:
        c.part = PART
    watcher = Watcher(c.run_dir / SUMMARY)
    c.start(modes)
    assert c.wait() == [0, 0], c.output()
    seen = watcher.stop()
    assert len(seen) == 1, seen  # never there early (the trainer's part alone), written once
    summary = seen[0]
    assert summary == c.json(SUMMARY)
    assert (summary["status"], summary["attempt"]) == ("completed", "a1")
    restarts = options.get("restarts", 0)
    assert [a["restart"] for a in summary["attempts"]] == list(range(restarts + 1))
    assert summary["restarts"] == restarts
    if "program" in options:
        assert summary["program"] == "train.py"
    else:
        assert summary["steps"] == PART["steps"]  # the trainer's part, merged
    if restarts:  # the run's wall time spans its starts; the part's is the last start's
        first, last = summary["attempts"][0], summary["attempts"][-1]
        assert summary["wall_time_sec"] == round(last["ended"] - first["started"], 1)
        assert summary["last_start_wall_time_sec"] == PART["wall_time_sec"]
    assert not c.part_path.exists()  # consumed: a later attempt never merges it again
    assert "status completed" in (c.run_dir / "report.txt").read_text()  # drawn from it


def test_a_failed_run_s_summary_has_the_cause_the_part_and_the_attempts(cluster):
    c = cluster(2)
    c.part_path.write_text(json.dumps({**PART, "status": "failed", "error": "X"}))
    watcher = Watcher(c.run_dir / SUMMARY)
    c.start({0: "run:30", 1: "exit:5:2"})
    assert all(code != 0 for code in c.wait()), c.output()
    seen = watcher.stop()
    assert len(seen) == 1, seen
    summary = seen[0]
    assert (summary["status"], summary["failure"]["host"]) == ("failed", "h1")
    assert summary["error"] == "X"  # the trainer's, kept
    assert summary["cause"].startswith("run t1 failed: host h1 rank 1")
    assert [bool(a["ended"]) for a in summary["attempts"]] == [True]


def test_a_stand_in_for_node_rank_0_writes_the_whole_summary_and_keeps_the_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node rank 0's host gone (store lost, progress.json unchanged): h1's agent writes the
    summary in its place, part and attempts in, and leaves the part for node rank 0's agent,
    which may still end after it."""
    monkeypatch.setattr(ending, "PROGRESS_EVERY", 0.05)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the agent's heartbeat directory
    run = tmp_path / "run"
    run.mkdir()
    (run / TRAINER_PART).write_text(json.dumps(PART))
    (run / "progress.json").write_text(json.dumps({"attempt": "a2", "state": "running"}))
    args = ["--run-dir", str(run), "--run-id", "t1", "--hosts", "h0,h1", "--host", "h1",
            "--node-rank", "1", "--store", "127.0.0.1:1", "--attempt", "a2", "--key-file", "k",
            "--", "true"]  # fmt: skip
    agent = Agent(parse_args(args))
    agent.cfg.settle = 0.05
    agent.starts.attempts = [dict(a) for a in ATTEMPTS]
    failure = {"host": "h0", "rank": 0, "reason": "host h0 silent"}
    agent.ending._write_summary("failed", Standing(failure, store_ok=False))
    assert agent.records.flush(5)
    summary = json.loads((run / SUMMARY).read_text())
    assert (summary["status"], summary["attempt"], summary["steps"]) == ("failed", "a2", 6)
    assert summary["cause"] == "run t1 failed: host h0 rank 0: host h0 silent"
    assert summary["attempts"] == ATTEMPTS
    assert (run / TRAINER_PART).exists()
    assert json.loads((run / "progress.json").read_text())["status"] == "failed"


def test_records_write_nothing_before_the_end_and_once_at_it(tmp_path: Path) -> None:
    (tmp_path / TRAINER_PART).write_text(json.dumps(PART))
    records = Records(str(tmp_path), "h0")
    records.write_failure("t1", "a2", FAILURE, 5, diagnosis="rank 1 in all_reduce")
    assert records.flush(5)
    assert not (tmp_path / SUMMARY).exists()  # noted, not written
    records.write_attempts(ATTEMPTS, 0)
    assert records.flush(5)
    summary = json.loads((tmp_path / SUMMARY).read_text())
    assert (summary["status"], summary["diagnosis"], summary["attempts"]) == (
        "failed", "rank 1 in all_reduce", ATTEMPTS,
    )  # fmt: skip
    assert not (tmp_path / TRAINER_PART).exists()


def test_records_write_no_summary_without_a_status(tmp_path: Path) -> None:
    """Nothing ran and nothing failed (no part, no note): no summary saying nothing."""
    records = Records(str(tmp_path), "h0")
    records.write_attempts(ATTEMPTS, 0)
    assert records.flush(5)
    assert not (tmp_path / SUMMARY).exists()


def test_merge_of_a_failure_keeps_the_part_and_adds_the_cause_and_attempts() -> None:
    ending_ = {"attempt": "a2", "failure": {**FAILURE, "log_tail": ["x"]}, "cause": "c",
               "diagnosis": "d"}  # fmt: skip
    summary = merge({**PART, "status": "failed", "error": "E"}, ending_, ATTEMPTS, 1)
    assert summary == {**PART, "status": "failed", "error": "E", "failure": ending_["failure"],
                       "cause": "c", "diagnosis": "d", "attempt": "a2", "attempts": ATTEMPTS,
                       "restarts": 1}  # fmt: skip


@pytest.mark.parametrize(
    ("trainer_said", "status", "by_agent"),
    [("stopped", "stopped", False), ("completed", "completed", False), (None, "stopped", True)],
)
def test_merge_marks_a_stop_by_the_agent_only_where_the_trainer_recorded_none(
    trainer_said, status, by_agent
) -> None:
    part = {**PART, "status": trainer_said} if trainer_said else {}
    summary = merge(part, {"attempt": "a2", "stopped_at": 5.0}, ATTEMPTS, 0)
    assert summary["status"] == status
    assert (summary.get("stopped_by") == "agent") is by_agent


def test_merge_of_a_program_drops_an_earlier_attempt_s_outcome_and_keeps_its_keys() -> None:
    earlier = {"status": "failed", "attempt": "a1", "failure": {}, "cause": "old", "acc": 0.5}
    facts = {"program": "p.py", "world_size": 2, "hosts": {"h0": {"exit_code": 0}}}
    ending_ = {"attempt": "a2", "run_id": "t1", "program": {"outcome": "completed", "facts": facts}}
    summary = merge(earlier, ending_, ATTEMPTS, 0)
    assert (summary["status"], summary["acc"], summary["run_id"]) == ("completed", 0.5, "t1")
    assert not {"failure", "cause"} & summary.keys()


def test_a_restarted_run_s_wall_time_is_from_its_first_start_to_its_end() -> None:
    """The trainer's part counts its own start alone (7.8 s of a 68.2 s run that lost a host
    seen in the sandbox); the run's is the first start's to the last start's end."""
    starts = [{**ATTEMPTS[0], "started": 1000.0, "ended": 1021.5},
              {**ATTEMPTS[0], "restart": 1, "started": 1040.2, "ended": 1068.2}]  # fmt: skip
    summary = merge({**PART, "wall_time_sec": 7.8}, {"attempt": "a2"}, starts, 1)
    assert (summary["wall_time_sec"], summary["last_start_wall_time_sec"]) == (68.2, 7.8)
    one = merge(PART, {"attempt": "a2"}, starts[:1], 0)  # one start: the trainer's, as it was
    assert (one["wall_time_sec"], "last_start_wall_time_sec" in one) == (3.2, False)
    unknown = [starts[0], {**starts[1], "ended": None}]  # a stand-in's end: no time recorded
    assert merge(PART, {"attempt": "a2"}, unknown, 1)["wall_time_sec"] == 3.2


def test_merge_base_is_the_part_else_this_attempt_s_summary(tmp_path: Path) -> None:
    assert merge_base(tmp_path, "a2", program=False) == {}
    (tmp_path / SUMMARY).write_text(json.dumps({"status": "completed", "attempt": "a1"}))
    assert merge_base(tmp_path, "a2", program=False) == {}  # an earlier attempt's
    assert merge_base(tmp_path, "a2", program=True)["attempt"] == "a1"  # a program's keys
    (tmp_path / SUMMARY).write_text(json.dumps({"status": "failed", "attempt": "a2"}))
    assert merge_base(tmp_path, "a2", program=False)["status"] == "failed"
    (tmp_path / TRAINER_PART).write_text(json.dumps(PART))
    assert merge_base(tmp_path, "a2", program=False) == PART
    assert merge_base(tmp_path, "a2", program=True) == {**PART, "attempt": "a2"}


@pytest.mark.parametrize("agent", [True, False], ids=["under-an-agent", "standalone"])
def test_the_trainer_writes_its_part_under_an_agent_and_the_summary_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: bool
) -> None:
    if agent:
        monkeypatch.setenv("DDPFLEET_HEARTBEAT_DIR", str(tmp_path / "beats"))
    else:
        monkeypatch.delenv("DDPFLEET_HEARTBEAT_DIR", raising=False)
    written = write_trainer_summary(tmp_path, PART)
    assert written.name == (TRAINER_PART if agent else SUMMARY)
    assert sorted(p.name for p in tmp_path.iterdir()) == [written.name]
    assert json.loads(written.read_text()) == PART
