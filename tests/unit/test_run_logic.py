"""Unit tests of roles/trainer_run/module_utils/ddpfleet_run.py: the decisions supervision,
failure reporting and the end-of-run report make."""

from __future__ import annotations

import json

import pytest
from plugin_loader import load_plugin

run = load_plugin("ddpfleet_run", "roles/trainer_run/module_utils/ddpfleet_run.py")

TORCHRUN_FAILURE = """
[rank1]: RuntimeError: boom
E1122 00:00:01 torch/distributed/elastic/multiprocessing/api.py: failed (exitcode: 1)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
trainer FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_00:00:01
  host      : node2
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


@pytest.mark.parametrize(
    ("run_id", "ok"),
    [
        ("1234", True),
        ("exp_1.resnet-50", True),
        ("a" * 64, True),
        ("a" * 65, False),
        ("", False),
        ("bad/id", False),
        ("has space", False),
        ("..", False),
        ("x;rm", False),
        (1234, False),
    ],
)
def test_valid_run_id(run_id, ok):
    assert run.valid_run_id(run_id) is ok


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-22T00:00:01.5Z", 1795305601.5),
        ("2026-11-22T00:00:01.123456789Z", 1795305601.123456789),
        ("2026-11-22T01:00:01+01:00", 1795305601.0),
        ("0001-01-01T00:00:00Z", None),
        ("", None),
        ("yesterday", None),
    ],
)
def test_parse_docker_time(value, expected):
    got = run.parse_docker_time(value)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, abs=1e-6)


def test_container_state_absent_and_exited():
    assert run.container_state(None)["state"] == "absent"
    st = run.container_state(
        {
            "State": {
                "Status": "exited",
                "ExitCode": 137,
                "OOMKilled": False,
                "StartedAt": "2026-11-22T00:00:00Z",
                "FinishedAt": "2026-11-22T00:00:10Z",
            }
        }
    )
    assert st["state"] == "exited"
    assert st["exit_code"] == 137
    assert st["finished_at"] - st["started_at"] == pytest.approx(10)


def test_running_container_has_no_exit_code():
    st = run.container_state({"State": {"Status": "running", "ExitCode": 0}})
    assert st["exit_code"] is None


@pytest.mark.parametrize(
    ("node_rank", "nproc", "ranks"), [(0, 1, [0]), (2, 1, [2]), (1, 4, [4, 5, 6, 7])]
)
def test_global_ranks_static_layout(node_rank, nproc, ranks):
    assert run.global_ranks(node_rank, nproc) == ranks


def test_fresh_heartbeats_are_not_stalled():
    beats = {0: {"step": 5, "time": 99.0}, 1: {"step": 5, "time": 98.0}}
    assert run.stalled_rank([0, 1], beats, started_at=0.0, now=100.0, timeout=10) is None


def test_old_heartbeat_names_the_rank_and_step():
    beats = {0: {"step": 5, "time": 99.0}, 1: {"step": 3, "time": 50.0}}
    rank, reason = run.stalled_rank([0, 1], beats, started_at=0.0, now=100.0, timeout=10)
    assert rank == 1
    assert "step 3" in reason


def test_startup_counts_from_container_start_until_first_heartbeat():
    assert run.stalled_rank([4], {}, started_at=95.0, now=100.0, timeout=10) is None
    rank, reason = run.stalled_rank([4], {}, started_at=80.0, now=100.0, timeout=10)
    assert rank == 4
    assert "no heartbeat" in reason


def test_parse_root_cause_from_torchrun_output():
    assert run.parse_root_cause(TORCHRUN_FAILURE) == (3, 1)
    assert run.parse_root_cause("all good\n") is None


@pytest.mark.parametrize(
    ("code", "oom", "phrase"),
    [
        (None, False, "disappeared"),
        (137, False, "killed"),
        (137, True, "OOM"),
        (143, False, "SIGTERM"),
        (1, False, "code 1"),
    ],
)
def test_describe_exit(code, oom, phrase):
    assert phrase in run.describe_exit(code, oom)


def test_root_cause_is_the_earliest_failure_not_the_earliest_detection():
    killed = {"host": "node2", "rank": 1, "failed_at": 100.0, "time": 103.0}
    follow_on = {"host": "node1", "rank": 0, "failed_at": 101.0, "time": 101.5}
    assert run.root_cause([follow_on, killed])["host"] == "node2"
    assert run.root_cause([]) is None


def test_cause_line_names_host_rank_and_code():
    line = run.cause_line(
        "r1", {"host": "node2", "rank": 1, "reason": "container was killed", "exit_code": 137}
    )
    assert line == "run r1 failed: host node2 rank 1: container was killed"
    assert "\n" not in line


def test_tail_lines_skips_blank_lines():
    assert run.tail_lines("a\n\nb\nc\n", 2) == ["b", "c"]
    assert run.tail_lines("a\n", 0) == []


def test_read_markers_and_heartbeats_from_a_run_dir(tmp_path):
    (tmp_path / "nodes").mkdir()
    (tmp_path / "heartbeat").mkdir()
    (tmp_path / "nodes" / "node2.failed").write_text(json.dumps({"host": "node2", "rank": 1}))
    (tmp_path / "nodes" / "node1.log").write_text("not a marker")
    (tmp_path / "heartbeat" / "rank-1.json").write_text('{"rank": 1, "step": 7, "time": 5}')
    (tmp_path / "heartbeat" / "rank-2.json").write_text('{"rank": 2, "st')  # half written
    assert [m["host"] for m in run.read_markers(str(tmp_path))] == ["node2"]
    assert run.read_heartbeats(str(tmp_path), [0, 1, 2]) == {1: {"rank": 1, "step": 7, "time": 5}}


def test_read_metrics_skips_torn_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 10, "loss": 6.9}\n{"step": 20, "loss": 6.5}\n{"step": 3')
    assert [r["step"] for r in run.read_metrics(str(path))] == [10, 20]
    assert run.read_metrics(str(tmp_path / "missing.jsonl")) == []


def test_write_atomic_reports_unchanged_content(tmp_path):
    path = str(tmp_path / "f.json")
    assert run.write_atomic(path, b"{}\n") is True
    assert run.write_atomic(path, b"{}\n") is False
    assert run.write_atomic(path, b"[]\n", 0o600) is True
    assert (tmp_path / "f.json").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


SUMMARY = {
    "status": "completed",
    "steps": 30,
    "world_size": 4,
    "images_per_sec": 100.0,
    "per_rank_images_per_sec": [26.0, 25.0, 20.0, 29.0],
    "final_loss": 6.5,
    "final_accuracy": 0.01,
    "wall_time_sec": 42.0,
}


def test_stragglers_are_below_ratio_of_median():
    assert run.stragglers(SUMMARY, 0.9) == [2]
    assert run.stragglers(SUMMARY, 0.5) == []
    assert run.stragglers({"per_rank_images_per_sec": {"1": 10.0, "0": 30.0}}, 0.9) == [1]


def test_report_lines_flag_stragglers_and_show_totals():
    lines = run.report_lines(SUMMARY, 0.9)
    assert lines[0].split() == ["rank", "img/s", "note"]
    assert "STRAGGLER" in lines[3]
    assert "STRAGGLER" not in lines[1] + lines[2] + lines[4]
    assert lines[5].split() == ["total", "100.0"]
    assert "final loss 6.5000" in lines[6]
    assert "wall time 42.0s" in lines[6]


def test_report_lines_tolerate_a_sparse_summary():
    lines = run.report_lines({"status": "completed"})
    assert lines[-2].split() == ["total", "?"]
    assert "final loss ?" in lines[-1]


def test_series_picks_the_first_present_key():
    records = [{"step": 10, "loss": 2.0}, {"step": 20, "train_loss": 1.5}, {"epoch": 1}]
    assert run.series(records, ("loss", "train_loss")) == ([10.0, 20.0], [2.0, 1.5])
