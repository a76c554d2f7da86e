"""The trainer_run modules, run for real through `ansible localhost -m` (no Docker needed):
run-directory I/O, failure finalisation, the report PNG, and preflight's shared-storage and
port checks."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

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
        f"module_utils = {ROLE / 'module_utils'}\n"
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


def test_run_dir_creates_cleans_writes_and_reads(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    stale = run_dir / "nodes"
    stale.mkdir(parents=True)
    (stale / "n1.failed").write_text("{}")
    (stale / "n1.log").write_text("kept")
    result = module(
        "ddpfleet_run_dir",
        {
            "path": str(run_dir),
            "mkdirs": [".", "nodes", "heartbeat"],
            "remove": ["nodes/*.failed"],
            "files": [
                {"path": "config.json", "content": '{"a": 1}'},
                {"path": "launch.sh", "content": "#!/bin/sh\n", "mode": "0755"},
                {"path": "report.png", "content_b64": base64.b64encode(b"\x89PNG").decode()},
            ],
            "read": ["config.json", "missing.json"],
        },
    )
    assert result["changed"] is True
    assert result["removed"] == ["nodes/n1.failed"]
    assert result["content"] == {"config.json": '{"a": 1}'}
    assert (run_dir / "heartbeat").is_dir()
    assert (run_dir / "nodes" / "n1.log").read_text() == "kept"
    assert (run_dir / "launch.sh").stat().st_mode & 0o777 == 0o755
    assert (run_dir / "report.png").read_bytes() == b"\x89PNG"


def test_run_dir_refuses_paths_outside_the_run(tmp_path):
    result = module(
        "ddpfleet_run_dir",
        {"path": str(tmp_path), "files": [{"path": "../escape", "content": "x"}]},
        expect_ok=False,
    )
    assert "outside" in result["msg"]
    assert not (tmp_path.parent / "escape").exists()


def _failed_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "r2"
    (run_dir / "nodes").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": "failed", "world_size": 3}))
    markers = {
        "node1": {
            "host": "node1",
            "rank": 0,
            "exit_code": 1,
            "reason": "rank 0 exited with code 1",
            "failed_at": 105.0,
            "time": 105.5,
        },
        "node2": {
            "host": "node2",
            "rank": 1,
            "exit_code": 137,
            "reason": "container was killed (SIGKILL, exit code 137)",
            "failed_at": 100.0,
            "time": 106.0,
        },
    }
    for host, marker in markers.items():
        (run_dir / "nodes" / f"{host}.failed").write_text(json.dumps(marker))
    (run_dir / "logs" / "rank-1.log").write_text("".join(f"line {i}\n" for i in range(30)))
    return run_dir


def test_finalize_records_the_earliest_failure(tmp_path):
    run_dir = _failed_run(tmp_path)
    result = module(
        "ddpfleet_run_finalize",
        {"run_dir": str(run_dir), "run_id": "r2", "outcome": "failed", "log_lines": 5},
    )
    assert result["cause"] == (
        "run r2 failed: host node2 rank 1: container was killed (SIGKILL, exit code 137)"
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["world_size"] == 3
    assert summary["failure"]["host"] == "node2"
    assert summary["failure"]["rank"] == 1
    assert summary["failure"]["exit_code"] == 137
    assert summary["failure"]["log_tail"] == [f"line {i}" for i in range(25, 30)]


def test_finalize_without_markers_fails_clearly(tmp_path):
    (tmp_path / "nodes").mkdir()
    result = module(
        "ddpfleet_run_finalize",
        {"run_dir": str(tmp_path), "run_id": "r3", "outcome": "failed"},
        expect_ok=False,
    )
    assert "no failure marker" in result["msg"]


@pytest.mark.parametrize(
    ("before", "after", "changed"),
    [(None, "stopped", True), ("stopped", "stopped", False), ("completed", "completed", False)],
)
def test_finalize_stopped_keeps_what_the_trainer_wrote(tmp_path, before, after, changed):
    if before:
        (tmp_path / "summary.json").write_text(json.dumps({"status": before, "steps": 7}))
    result = module(
        "ddpfleet_run_finalize", {"run_dir": str(tmp_path), "run_id": "r4", "outcome": "stopped"}
    )
    assert result["status"] == after
    assert result["changed"] is changed
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == after


def test_report_builds_the_table_and_a_png(tmp_path):
    metrics = "\n".join(
        json.dumps({"step": s, "loss": 7 - s / 10, "images_per_sec": 30 + s})
        for s in range(10, 40, 10)
    )
    summary = {
        "status": "completed",
        "world_size": 3,
        "images_per_sec": 90.0,
        "per_rank_images_per_sec": [31.0, 32.0, 20.0],
        "final_loss": 4.0,
        "final_accuracy": None,
        "wall_time_sec": 61.5,
        "steps": 30,
    }
    result = module("ddpfleet_run_report", {"run_id": "r5", "summary": summary, "metrics": metrics})
    assert result["stragglers"] == [2]
    assert any("STRAGGLER" in line for line in result["lines"])
    png = base64.b64decode(result["png_b64"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 5000


def test_report_without_metrics_has_no_png():
    result = module("ddpfleet_run_report", {"run_id": "r6", "summary": {"status": "completed"}})
    assert result["png_b64"] == ""


def test_port_probe_reports_a_busy_port():
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = module(
            "ddpfleet_run_port_probe",
            {"host": "node1", "port": port, "timeout": 1},
            expect_ok=False,
        )
    assert result["msg"] == f"rendezvous port {port} is busy on node1"


def test_port_probe_sees_who_connected():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    result = module(
        "ddpfleet_run_port_probe",
        {"host": "node1", "port": port, "expect": ["127.0.0.1"], "timeout": 1},
    )
    assert result["connected"] == []
    assert result["missing"] == ["127.0.0.1"]


def test_preflight_names_every_problem_on_one_line(tmp_path):
    (tmp_path / "runs").mkdir()
    token = tmp_path / "runs" / ".preflight-r7"
    token.write_text("other")
    result = module(
        "ddpfleet_run_preflight",
        {
            "host": "node3",
            "peers": [
                {"name": "ghost", "hostname": "no-such-host.invalid", "cluster_ip": "10.9.9.9"}
            ],
            "image": "ddpfleet/no-such-image:0",
            "shm_mb": 1,
            "data_dir": str(tmp_path / "datasets" / "absent"),
            "token_path": str(token),
            "token": "expected",
        },
        expect_ok=False,
    )
    msg = result["msg"]
    assert msg.startswith("preflight failed on node3: ")
    assert "\n" not in msg
    assert "no-such-host.invalid does not resolve" in msg
    assert "image ddpfleet/no-such-image:0 is not present" in msg
    assert f"data dir {tmp_path}/datasets/absent is absent" in msg
    assert "shared storage is not shared" in msg


def test_preflight_checks_name_resolution_and_shm(tmp_path):
    token = tmp_path / "t"
    token.write_text("tok")
    result = module(
        "ddpfleet_run_preflight",
        {
            "host": "node1",
            "peers": [{"name": "lh", "hostname": "localhost", "cluster_ip": "10.9.9.9"}],
            "image": "ddpfleet/no-such-image:0",
            "shm_mb": 10**9,
            "ipc_host": True,
            "token_path": str(token),
            "token": "tok",
        },
        expect_ok=False,
    )
    assert "localhost resolves to 127.0.0.1, not its cluster_ip 10.9.9.9" in result["msg"]
    assert "/dev/shm is" in result["msg"]
    assert "shared storage" not in result["msg"]
