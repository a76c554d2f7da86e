"""ddpfleet_agent/report.py in-process: the run's status word, report.txt's table
and the report.png chart node rank 0's agent writes for a completed run."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from PIL import Image

from ddpfleet_agent import report
from ddpfleet_agent.cli import BadAgentInput, parse_args

HOSTS = ["node1", "node2", "node3"]
SUMMARY = {
    "status": "completed",
    "world_size": 3,
    "images_per_sec": 90.0,
    "per_rank_images_per_sec": [31.0, 32.0, 20.0],
    "final_loss": 4.0,
    "final_accuracy": None,
    "wall_time_sec": 61.5,
    "steps": 30,
}
ROWS = [{"step": s, "loss": 7 - s / 10, "images_per_sec": 30 + s} for s in range(10, 40, 10)]
BLUE, ORANGE = report.BLUE, report.ORANGE


# --- the status word -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcomes", "failed", "status"),
    [
        (["completed"] * 3, False, "completed"),
        (["stopped"] * 3, False, "stopped"),
        (["completed", "stopped", "stopped"], False, "stopped"),
        (["failed", "stopped", "stopped"], False, "failed"),
        (["completed", "completed", None], False, "unknown"),  # a host's exit never came
        (["failed", "failed", None], True, "failed"),  # the failed host died with its agent
        (["completed"] * 3, True, "failed"),  # ranks done before another host's failure
    ],
)
def test_run_status_from_every_hosts_outcome(outcomes, failed, status):
    known = {h: o for h, o in zip(HOSTS, outcomes, strict=True) if o is not None}
    assert report.run_status(HOSTS, known, failed) == status


# --- report.txt ------------------------------------------------------------------------------


def test_report_lines_flag_stragglers_and_show_totals():
    lines = report.report_lines(SUMMARY, 0.9)
    assert lines[0].split() == ["rank", "host", "batch", "img/s", "note"]
    assert lines[3].split() == ["2", "?", "?", "20.0", "STRAGGLER", "(0.65x", "median)"]
    assert "STRAGGLER" not in lines[1] + lines[2]
    assert lines[4].split() == ["total", "90.0"]
    assert "final loss 4.0000, final accuracy ?, wall time 61.5s" in lines[5]


def test_report_lines_flag_by_the_ratio_given():
    assert not any("STRAGGLER" in line for line in report.report_lines(SUMMARY, 0.6))


def test_report_lines_read_per_rank_rates_keyed_by_rank():
    lines = report.report_lines({"per_rank_images_per_sec": {"1": 10.0, "0": 30.0}}, 0.9)
    assert [line.split()[0:4:3] for line in lines[1:3]] == [["0", "30.0"], ["1", "10.0"]]
    assert "STRAGGLER" in lines[2]


def test_report_lines_show_each_hosts_batch_share_and_judge_img_s_per_share():
    """train_balance: node3's 8 of 48 images at a third of the rate is its share, not a
    straggler; a rank slow for its share still is."""
    summary = {
        "per_rank_images_per_sec": [40.0, 40.0, 20.0, 20.0, 10.0, 5.0],
        "per_rank_batch": [16, 16, 8, 8, 4, 4],
    }
    lines = report.report_lines(summary, 0.9, HOSTS, 2)
    rows = [line.split() for line in lines[1:7]]
    assert [r[:4] for r in rows] == [
        ["0", "node1", "16", "(29%)"],
        ["1", "node1", "16", "(29%)"],
        ["2", "node2", "8", "(14%)"],
        ["3", "node2", "8", "(14%)"],
        ["4", "node3", "4", "(7%)"],
        ["5", "node3", "4", "(7%)"],
    ]
    assert [r[0] for r in rows if "STRAGGLER" in r] == ["5"]


def test_report_lines_tolerate_a_sparse_summary():
    lines = report.report_lines({"status": "completed"})
    assert lines[-2].split() == ["total", "?"]
    assert "final loss ?" in lines[-1]


def test_report_lines_of_a_user_program_show_exits_wall_time_and_the_log_tail():
    summary = {"program": "pkg.train", "status": "failed", "world_size": 4, "wall_time_sec": 12.34,
               "hosts": {"node1": {"exit_code": 1, "outcome": "failed",
                                   "log_tail": [f"line {i}" for i in range(8)]},
                         "node2": {"exit_code": None, "outcome": "no exit record"}}}  # fmt: skip
    lines = report.program_lines(summary)
    assert lines[1].split() == ["node1", "1", "failed"]
    assert lines[2].split() == ["node2", "?", "no", "exit", "record"]
    assert lines[3] == "program pkg.train: status failed, world size 4, wall time 12.3s"
    assert lines[4:] == ["last lines of node1's log:"] + [f"  line {i}" for i in range(3, 8)]


def test_parse_args_takes_the_straggler_ratio_and_derives_processes_per_host():
    base = ["--run-dir", "d", "--run-id", "r", "--hosts", "a,b", "--store", "x:1"]  # fmt: skip
    base += ["--key-file", "k"]
    base += ["--host", "a", "--node-rank", "0"]
    cfg = parse_args([*base, "--world-size", "6", "--straggler-ratio", "0.5", "--", "cmd"])
    assert (cfg.nproc, cfg.straggler_ratio) == (3, 0.5)
    assert parse_args([*base, "--", "cmd"]).nproc == 1  # no --world-size: one per host
    with pytest.raises(BadAgentInput, match="--straggler-ratio"):
        parse_args([*base, "--straggler-ratio", "1.5", "--", "cmd"])


# --- metrics.jsonl and report.png ------------------------------------------------------------


def test_read_metrics_keeps_rows_with_a_step_and_never_follows_a_link(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 10, "loss": 2.0}\n{"loss": 1.0}\n[1]\n{"step": 2')  # torn last row
    assert report.read_metrics(path) == [{"step": 10, "loss": 2.0}]
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    assert report.read_metrics(link) == []
    assert report.read_metrics(tmp_path / "absent") == []


def test_series_keeps_rows_with_a_step_and_a_finite_value():
    rows = [{"step": 10, "loss": 2.0}, {"step": 20}, {"loss": 1.0}, {"step": 30, "loss": 1.5},
            {"step": 40, "loss": float("nan")}, {"step": 50, "loss": float("inf")}]  # fmt: skip
    assert report.series(rows, "loss") == [(10.0, 2.0), (30.0, 1.5)]


def test_png_of_a_diverged_run_still_draws():
    rows = [*ROWS, {"step": 40, "loss": float("nan"), "images_per_sec": 70.0}]
    assert report.render_png("r5", rows).startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (0, 1, [0, 0.2, 0.4, 0.6, 0.8, 1]),
        (3.2, 7.9, [4, 5, 6, 7]),
        (95, 105, [96, 98, 100, 102, 104]),
    ],
)
def test_ticks_are_round_values_inside_the_range(lo, hi, expected):
    assert report.ticks(lo, hi) == expected


def colours(png: bytes) -> dict[tuple[int, int, int], int]:
    img = Image.open(io.BytesIO(png)).convert("RGB")
    assert img.size == (report.W, report.H)
    return {c: n for n, c in img.getcolors(report.W * report.H)}


def test_png_is_the_same_bytes_for_the_same_rows_and_draws_both_series():
    png = report.render_png("r5", ROWS)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert png == report.render_png("r5", ROWS)
    assert png != report.render_png("r6", ROWS)  # the title names the run
    seen = colours(png)
    assert seen.get(BLUE, 0) > 200  # the loss line (2 px wide) and its axis labels
    assert seen.get(ORANGE, 0) > 200  # img/s


def test_png_without_throughput_draws_no_img_s_axis_or_line():
    only_loss = [{"step": r["step"], "loss": r["loss"]} for r in ROWS]
    with_rate = colours(report.render_png("r5", ROWS)).get(ORANGE, 0)
    # the right axis title stays (orange text); the line and tick labels go
    assert colours(report.render_png("r5", only_loss)).get(ORANGE, 0) < with_rate / 2


# --- write_report: the files node rank 0's agent writes --------------------------------------


def run_dir(tmp_path: Path, summary: dict, rows: list[dict] | None = None) -> Path:
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    if rows is not None:
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_write_report_writes_the_table_and_plot_and_no_temp_file(tmp_path: Path):
    d = run_dir(tmp_path, SUMMARY, ROWS)
    note = report.write_report(d, "r5", HOSTS, 1, 0.9)
    assert note == "report.txt and report.png written"
    text = (d / "report.txt").read_text()
    assert text.splitlines() == report.report_lines(SUMMARY, 0.9, HOSTS, 1)
    assert text.splitlines()[3].split()[:2] == ["2", "node3"]
    assert (d / "report.png").read_bytes() == report.render_png("r5", ROWS)
    assert sorted(p.name for p in d.iterdir()) == [
        "metrics.jsonl", "report.png", "report.txt", "summary.json",
    ]  # fmt: skip


def test_write_report_of_a_user_program_shows_its_exits(tmp_path: Path):
    summary = {"program": "x.py", "status": "completed", "hosts": {"node1": {"exit_code": 0}}}
    d = run_dir(tmp_path, summary)
    assert report.write_report(d, "r5", HOSTS, 1, 0.9).endswith("no report.png)")
    assert (d / "report.txt").read_text().splitlines() == report.program_lines(summary)
    assert not (d / "report.png").exists()


def test_write_report_without_pillow_writes_the_table_only(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL raises ImportError
    d = run_dir(tmp_path, SUMMARY, ROWS)
    assert report.write_report(d, "r5", HOSTS, 1, 0.9).startswith("report.txt written; report.png")
    assert (d / "report.txt").exists()
    assert not (d / "report.png").exists()


def test_restarts_are_a_line_each_in_the_table_and_a_red_line_on_the_plot():
    restart = {"restart": 1, "from_step": 2, "heal_sec": 13.9, "cause": "run r5 failed: x"}
    attempts = [{"restart": 0, "from_step": 0}, restart]
    summary = {"status": "completed", "steps": 4, "attempts": attempts}
    assert report.report_lines(summary)[-1] == (
        "restart 1 at step 2 (healed in 13.9 s) after: run r5 failed: x"
    )
    assert report.report_lines({"status": "completed"})[-1].startswith("status completed")
    h = ["n1", "n2", "n3"]
    attempts = [{"hosts": h}, {"from_step": 5, "heal_sec": 9.9, "cause": "c1", "hosts": h[:2]},
                {"from_step": 15, "heal_sec": 13.8, "cause": "n3 back: x", "hosts": h}]  # fmt: skip
    assert report.report_lines({"status": "completed", "attempts": attempts})[-2:] == [
        "restart 1 at step 5 (healed in 9.9 s, on 2 hosts: without n3) after: c1",
        "restart 2 at step 15 (healed in 13.8 s, on 3 hosts: n3 back) after: n3 back: x",
    ]
    plain = colours(report.render_png("r5", ROWS))
    marked = colours(report.render_png("r5", ROWS, [(20.0, "restart 1")]))
    assert marked.get(report.RED, 0) > 100 > plain.get(report.RED, 0)
    assert marked.get(report.RED, 0) > colours(report.render_png("r5", ROWS, [(99.0, "x")])).get(
        report.RED, 0
    )  # a mark off the steps drawn is left out


def test_the_plot_marks_each_start_with_how_its_hosts_changed(tmp_path: Path, monkeypatch):
    drawn = []
    monkeypatch.setattr(report, "render_png", lambda _r, _rows, marks: drawn.extend(marks) or b"")
    h = ["n1", "n2", "n3"]
    attempts = [{"hosts": h}, {"from_step": 10, "hosts": h}, {"from_step": 20, "hosts": h[:2]},
                {"from_step": 30, "hosts": h}]  # fmt: skip
    report.write_report(run_dir(tmp_path, {**SUMMARY, "attempts": attempts}, ROWS), "r5", h, 1, 0.9)
    assert drawn == [(10.0, "restart 1"), (20.0, "restart 2: without n3"),
                     (30.0, "restart 3: n3 back")]  # fmt: skip
