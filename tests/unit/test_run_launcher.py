"""The launch wrapper (roles/trainer_run/files/launch.sh), run for real under /bin/sh:
output copied to nodes/<host>.log, exit code recorded, SIGTERM forwarded to the child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

WRAPPER = Path(__file__).resolve().parents[2] / "roles" / "trainer_run" / "files" / "launch.sh"
SH = "/bin/dash" if Path("/bin/dash").exists() else "/bin/sh"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "nodes").mkdir()
    return tmp_path


def _env(run_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DDPFLEET_RUN_DIR": str(run_dir),
        "DDPFLEET_HOST": "node2",
        "DDPFLEET_NODE_RANK": "1",
    }


def test_exit_code_and_output_are_recorded(run_dir):
    proc = subprocess.run(
        [SH, str(WRAPPER), "sh", "-c", "echo hello from rank; exit 3"],
        env=_env(run_dir),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 3
    assert "hello from rank" in proc.stdout
    record = json.loads((run_dir / "nodes" / "node2.exit").read_text())
    assert record["host"] == "node2"
    assert record["node_rank"] == 1
    assert record["exit_code"] == 3
    assert abs(record["time"] - time.time()) < 30
    log = (run_dir / "nodes" / "node2.log").read_text()
    assert "hello from rank" in log
    assert "exit code 3" in log


def test_sigterm_is_forwarded_and_the_childs_code_kept(run_dir):
    child = "trap 'echo checkpoint written; exit 7' TERM; echo ready; while :; do sleep 0.1; done"
    proc = subprocess.Popen(
        [SH, str(WRAPPER), "sh", "-c", child],
        env=_env(run_dir),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert "node_rank 1" in proc.stdout.readline()
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 7
    assert "checkpoint written" in out
    assert json.loads((run_dir / "nodes" / "node2.exit").read_text())["exit_code"] == 7
    assert "after SIGTERM" in (run_dir / "nodes" / "node2.log").read_text()


def test_log_is_appended_across_attempts(run_dir):
    for word in ("first", "second"):
        subprocess.run([SH, str(WRAPPER), "echo", word], env=_env(run_dir), check=True, timeout=30)
    log = (run_dir / "nodes" / "node2.log").read_text()
    assert log.index("first") < log.index("second")
