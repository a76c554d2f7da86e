"""The Prometheus announcement's two shell commands (roles/trainer_run/tasks/announce.yml), as
Ansible renders them, run by /bin/sh on a temporary discovery directory: two train.yml that
follow one run announce and withdraw it at the same time, and neither may fail on a file the
other has just renamed or removed (CI's test_30 two-at-once run failed that way)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from time_bounds import within

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "roles" / "trainer_run" / "tasks" / "announce.yml"
HOSTS = ("node1", "node2", "node3")
ROUNDS = 40  # races per test: each round starts both commands at once


def command(task_name: str, directory: Path, run_id: str, port: int = 29502) -> str:
    loader = DataLoader()
    tasks = {t["name"]: t for t in loader.load_from_file(str(TASKS))}
    hostvars: dict[str, dict[str, Any]] = {}
    for i, host in enumerate(HOSTS):
        # the endpoint record as the task before the announcement works it out, per host
        labels = {"run_id": run_id, "host": host, "__param_run_id": run_id}
        content = json.dumps([{"targets": [f"10.0.0.{11 + i}:{port}"], "labels": labels}])
        endpoint = {"file": f"{host}-{port}.json", "content": content}
        hostvars[host] = {"__trainer_run_endpoint": endpoint}
    variables = {
        "_trainer_run_monitoring_dir": str(directory),
        "run_id": run_id,
        "ansible_play_hosts": list(HOSTS),
        "hostvars": hostvars,
    }
    text = tasks[task_name]["ansible.builtin.shell"]["cmd"]
    return Templar(loader=loader, variables=variables).template(trust_as_template(text))


def sh(cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", cmd], check=False, capture_output=True, text=True)


def at_once(cmd: str, times: int = 2) -> list[subprocess.CompletedProcess[str]]:
    pipe = subprocess.PIPE
    procs = [subprocess.Popen(["/bin/sh", "-c", cmd], stdout=pipe, stderr=pipe, text=True)
             for _ in range(times)]  # fmt: skip
    done = []
    for p in procs:
        out, err = p.communicate(timeout=within(30))
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


ANNOUNCE = "Announce every host's run agent to Prometheus"
WITHDRAW = "Withdraw the run's endpoints from Prometheus"


def test_two_announcements_at_once_both_succeed_and_leave_whole_files(tmp_path: Path) -> None:
    cmd = command(ANNOUNCE, tmp_path, "r1")
    for _ in range(ROUNDS):
        for result in at_once(cmd):
            assert result.returncode == 0, result.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"{h}-29502.json" for h in HOSTS]
    record = json.loads((tmp_path / "node2-29502.json").read_text())
    labels = {"run_id": "r1", "host": "node2", "__param_run_id": "r1"}
    assert record == [{"targets": ["10.0.0.12:29502"], "labels": labels}]


def test_two_withdrawals_at_once_remove_each_file_once_and_keep_other_runs(tmp_path: Path) -> None:
    announce, withdraw = command(ANNOUNCE, tmp_path, "r1"), command(WITHDRAW, tmp_path, "r1")
    # another run's agent on another port, and a run whose id starts with this one's
    for other_run, port in (("r2", 29600), ("r10", 29700)):
        assert sh(command(ANNOUNCE, tmp_path, other_run, port)).returncode == 0
    for _ in range(ROUNDS):
        assert sh(announce).returncode == 0
        results = at_once(withdraw)
        for result in results:
            assert result.returncode == 0, result.stderr
        printed = sorted(line for r in results for line in r.stdout.splitlines())
        assert printed == [str(tmp_path / f"{h}-29502.json") for h in HOSTS]
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted(f"{h}-{port}.json" for h in HOSTS for port in (29600, 29700))


@pytest.mark.parametrize("state", ["no directory", "empty directory"])
def test_withdrawal_with_nothing_to_remove_prints_nothing(tmp_path: Path, state: str) -> None:
    directory = tmp_path / "runs"
    if state == "empty directory":
        directory.mkdir()
    result = sh(command(WITHDRAW, directory, "r1"))
    assert (result.returncode, result.stdout) == (0, "")
