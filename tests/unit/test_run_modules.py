"""The trainer_run modules, run for real through `ansible localhost -m` (no Docker needed): the
report table and PNG, the port probe and the host checks of preflight; and the report's table
logic as plain functions."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from plugin_loader import load_plugin

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "trainer_run"
ANSIBLE = ROOT / ".venv" / "bin" / "ansible"


@pytest.fixture(scope="module", autouse=True)
def ansible_cfg(tmp_path_factory) -> None:
    """An ansible.cfg that loads the role's modules and prints results as JSON."""
    cfg = tmp_path_factory.mktemp("cfg") / "ansible.cfg"
    cfg.write_text(
        "[defaults]\n"
        f"library = {ROLE / 'library'}\n"
        "stdout_callback = ansible.builtin.json\n"
        "bin_ansible_callbacks = true\n"
        f"interpreter_python = {ROOT / '.venv' / 'bin' / 'python'}\n"
    )
    os.environ["DDPFLEET_TEST_ANSIBLE_CFG"] = str(cfg)


def module(name: str, args: dict, expect_ok: bool = True) -> dict:
    """Run one module on localhost; return its result."""
    env = {**os.environ, "ANSIBLE_CONFIG": os.environ["DDPFLEET_TEST_ANSIBLE_CFG"]}
    proc = subprocess.run(
        [
            str(ANSIBLE),
            "localhost",
            "-i",
            "localhost,",
            "-c",
            "local",
            "-m",
            name,
            "-a",
            json.dumps(args),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert proc.stdout.strip(), proc.stderr
    out = json.loads(proc.stdout)
    result = out["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert bool(result.get("failed")) is not expect_ok, result
    return result


METRICS = "\n".join(
    json.dumps({"step": s, "loss": 7 - s / 10, "images_per_sec": 30 + s}) for s in range(10, 40, 10)
)
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


def test_report_builds_the_table_and_writes_the_same_png_every_time(tmp_path):
    """The same bytes each time: report.png is only rewritten when the run changed."""
    pngs = []
    for name in ("a.png", "b.png"):
        args = {"run_id": "r5", "summary": SUMMARY, "metrics": METRICS}
        result = module("ddpfleet_run_report", {**args, "png_path": str(tmp_path / name)})
        assert result["png"] is True
        assert any("STRAGGLER" in line for line in result["lines"])
        pngs.append((tmp_path / name).read_bytes())
    assert pngs[0].startswith(b"\x89PNG\r\n\x1a\n")
    assert len(pngs[0]) > 5000
    assert pngs[0] == pngs[1]


def test_report_without_metrics_writes_no_png(tmp_path):
    args = {"run_id": "r6", "summary": {"status": "completed"}, "png_path": str(tmp_path / "p")}
    assert module("ddpfleet_run_report", args)["png"] is False
    assert not (tmp_path / "p").exists()


report = load_plugin("ddpfleet_run_report", "roles/trainer_run/library/ddpfleet_run_report.py")


def test_report_lines_flag_stragglers_and_show_totals():
    lines = report.report_lines(SUMMARY, 0.9)
    assert lines[0].split() == ["rank", "host", "batch", "img/s", "note"]
    assert lines[3].split() == ["2", "?", "?", "20.0", "STRAGGLER", "(0.65x", "median)"]
    assert "STRAGGLER" not in lines[1] + lines[2]
    assert lines[4].split() == ["total", "90.0"]
    assert "final loss 4.0000, final accuracy ?, wall time 61.5s" in lines[5]


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
    lines = report.report_lines(summary, 0.9, ["node1", "node2", "node3"], 2)
    rows = [line.split() for line in lines[1:7]]
    assert [r[:4] for r in rows] == [
        ["0", "node1", "16", "(29%)"],
        ["1", "node1", "16", "(29%)"],
        ["2", "node2", "8", "(14%)"],
        ["3", "node2", "8", "(14%)"],
        ["4", "node3", "4", "(7%)"],
        ["5", "node3", "4", "(7%)"],
    ]
    flagged = [r[0] for r in rows if "STRAGGLER" in r]
    assert flagged == ["5"]


def test_report_lines_tolerate_a_sparse_summary():
    lines = report.report_lines({"status": "completed"})
    assert lines[-2].split() == ["total", "?"]
    assert "final loss ?" in lines[-1]


def test_series_keeps_records_with_a_step_and_the_value():
    records = [{"step": 10, "loss": 2.0}, {"step": 20}, {"loss": 1.0}, {"step": 30, "loss": 1.5}]
    assert report.series(records, "loss") == ([10.0, 30.0], [2.0, 1.5])


@pytest.mark.parametrize("which", ["rendezvous", "agent"])
def test_port_probe_names_the_busy_port(which):
    with socket.socket() as busy, socket.socket() as free:
        busy.bind(("0.0.0.0", 0))
        busy.listen(1)
        free.bind(("127.0.0.1", 0))
        ports = {"rendezvous": free.getsockname()[1], "agent": free.getsockname()[1]}
        ports[which] = busy.getsockname()[1]
        free.close()
        result = module(
            "ddpfleet_run_port_probe",
            {"host": "node1", "ports": ports, "timeout": 1},
            expect_ok=False,
        )
    assert result["msg"] == f"{which} port {ports[which]} is busy on node1"


def test_port_probe_names_the_ports_each_peer_missed():
    ports = {}
    for name in ("rendezvous", "agent"):
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            ports[name] = free.getsockname()[1]
    result = module(
        "ddpfleet_run_port_probe",
        {"host": "node1", "ports": ports, "expect": ["127.0.0.1"], "timeout": 1},
    )
    assert result["missing"] == {
        "127.0.0.1": [f"rendezvous port {ports['rendezvous']}", f"agent port {ports['agent']}"]
    }


def test_preflight_names_every_problem_on_one_line():
    result = module(
        "ddpfleet_run_preflight",
        {
            "host": "node3",
            "peers": [
                {"name": "ghost", "hostname": "no-such-host.invalid", "cluster_ip": "10.9.9.9"},
                {"name": "lh", "hostname": "localhost", "cluster_ip": "10.9.9.9"},
            ],
            "shm_mb": 10**9,
            "ipc_host": True,
            "cpus": len(os.sched_getaffinity(0)) + 0.5,
        },
        expect_ok=False,
    )
    msg = result["msg"]
    assert msg.startswith("preflight failed on node3: ")
    assert "\n" not in msg
    assert "no-such-host.invalid does not resolve" in msg
    assert "localhost resolves to 127.0.0.1, not its cluster_ip 10.9.9.9" in msg
    assert "/dev/shm is" in msg
    assert f"train_cpus is {len(os.sched_getaffinity(0)) + 0.5:g}, more than the " in msg


def test_preflight_passes_and_reports_what_the_engine_may_grant():
    peer = {"name": "lh", "hostname": "localhost", "cluster_ip": "127.0.0.1"}
    cpus = len(os.sched_getaffinity(0))  # a quota of every CPU fits
    result = module(
        "ddpfleet_run_preflight", {"host": "node1", "peers": [peer], "shm_mb": 1, "cpus": cpus}
    )
    assert result["gpu_models"] == []
    assert set(result["ulimits"]) == {"memlock", "stack"}


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
