"""train.yml's input validation, run for real against the sample inventory: a bad run_id is
refused in one line before any host is contacted (the sample's hosts do not exist)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def train(extra: dict) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    playbook = Path(sys.executable).with_name("ansible-playbook")
    return subprocess.run(
        [str(playbook), "-i", "inventory/sample/hosts.yml", "train.yml", "-e", json.dumps(extra)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("run_id", ["abc\n", "abc\nx", "bad/id", "..", "", "a" * 65, "../../etc"])
def test_bad_run_id_is_refused_before_any_host_is_contacted(run_id: str) -> None:
    proc = train({"run_id": run_id, "train_synthetic": True})
    assert proc.returncode != 0
    assert f"invalid run_id {json.dumps(run_id)}" in proc.stdout, proc.stdout[-2000:]
    assert "UNREACHABLE" not in proc.stdout


def test_good_run_id_passes_the_check() -> None:
    # the typo guard, the next check, stops it: still no host contacted
    proc = train({"run_id": "r-42_a.b", "train_synthetic": True, "train_bogus": 1})
    assert "invalid run_id" not in proc.stdout
    assert "unknown train option(s) train_bogus" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize(
    "data_dir",
    ["../../../etc", "a/../../..", "/etc", "/mnt/ddpfleet/../etc", "/mnt/ddpfleet/runs/x", ".."],
)
def test_data_dir_outside_shared_storage_is_refused(data_dir: str) -> None:
    proc = train({"run_id": "r1", "train_data_dir": data_dir})
    assert proc.returncode != 0
    assert f"train_data_dir {data_dir} is not under /mnt/ddpfleet/datasets" in proc.stdout, (
        proc.stdout[-2000:]
    )


@pytest.mark.parametrize("data_dir", ["imagenet/../imagenet-mini", "/mnt/ddpfleet/datasets/x"])
def test_data_dir_on_shared_storage_passes_the_check(data_dir: str) -> None:
    proc = train({"run_id": "r1", "train_data_dir": data_dir, "train_bogus": 1})
    assert "is not under /mnt/ddpfleet/datasets" not in proc.stdout
    assert "unknown train option(s) train_bogus" in proc.stdout, proc.stdout[-2000:]


def test_limit_that_leaves_trainers_out_is_refused() -> None:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    playbook = Path(sys.executable).with_name("ansible-playbook")
    extra = json.dumps({"run_id": "r1", "train_synthetic": True})
    proc = subprocess.run(
        [str(playbook), "-i", "inventory/sample/hosts.yml", "train.yml", "--limit", "gpu1",
         "-e", extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "--limit leaves out gpu2, gpu3: drop --limit" in proc.stdout, proc.stdout[-2000:]
    assert "UNREACHABLE" not in proc.stdout


@pytest.mark.parametrize(
    ("option", "value"),
    [("train_lr", "nan"), ("train_heartbeat_timeout", "inf"), ("train_workers", "-Infinity"),
     ("train_warmup_epochs", "1e999"), ("train_stop_timeout", "NaN")],
)  # fmt: skip
def test_non_finite_number_is_refused_in_one_line(option: str, value: str) -> None:
    """nan passed every minimum (and an inf timeout switches supervision off); an int option
    crashed the check itself."""
    proc = train({"run_id": "r1", "train_synthetic": True, option: value})
    assert proc.returncode != 0
    message = f'"msg": "{option} must be a finite number (got {value})"'
    assert message in proc.stdout, proc.stdout[-2000:]
    assert "UNREACHABLE" not in proc.stdout


def test_finite_numbers_pass_the_numeric_check() -> None:
    # the port check, the next one, stops it: still no host contacted
    extra = {"train_lr": "0.5", "train_heartbeat_timeout": 600, "train_master_port": 70000}
    proc = train({"run_id": "r1", "train_synthetic": True, **extra})
    assert "must be a finite number" not in proc.stdout
    assert "must be two different ports up to 65535" in proc.stdout, proc.stdout[-2000:]
