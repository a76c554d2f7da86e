"""roles/trainer_image's image build lock (host_lock's ddpfleet_lock, the one lock, whose node
side tests/unit/test_host_lock.py tests): the role around resolve/build/tag, run with
ansible-playbook on localhost as the registry host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from time_bounds import within

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "roles" / "host_lock" / "files" / "ddpfleet_lock.py"
RoleRun = tuple[Callable[..., str], Path]


def acquire(path: Path, token: str) -> None:
    argv = ["acquire", "--path", str(path), "--token", token, "--host", "ctl", "--pid", "42"]
    subprocess.run([sys.executable, str(LOCK), *argv, "--lease", "7200"], check=True,
                   capture_output=True)  # fmt: skip


def holder(path: Path) -> dict:
    return json.loads(path.read_text())


# --- the role: the lock around resolve/build/tag, released also on failure ---------------


@pytest.fixture
def role_run(tmp_path: Path) -> RoleRun:
    """Run roles/trainer_image on localhost (the registry host) with no Docker engine
    reachable: the lock is taken, resolving the base image fails, and the always-section
    must release the lock. Returns (output, lock path)."""
    lock_path = tmp_path / "state" / "trainer_image.lock"
    (tmp_path / "hosts.yml").write_text(
        json.dumps(
            {
                "all": {
                    "vars": {"registry_address": "127.0.0.1:5000"},
                    "children": {
                        "registry": {"hosts": {"reg1": {}}},
                        "trainers": {"hosts": {"reg1": {}}},
                    },
                    "hosts": {
                        "reg1": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                            "cluster_ip": "127.0.0.1",
                        }
                    },
                }
            }
        )
    )
    play = [{"name": "trainer_image on localhost", "hosts": "all", "gather_facts": False,
             "roles": ["trainer_image"]}]  # fmt: skip
    (tmp_path / "play.yml").write_text(json.dumps(play))

    def run(**extra: object) -> str:
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
            "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",
        }
        playbook = Path(sys.executable).with_name("ansible-playbook")
        proc = subprocess.run(
            [str(playbook), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"),
             "-e", json.dumps({"_trainer_image_lock": str(lock_path), **extra})],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=within(300), check=False,
        )  # fmt: skip
        return f"rc={proc.returncode}\n{proc.stdout}{proc.stderr}"

    return run, lock_path


def test_role_releases_the_lock_when_the_build_fails(role_run: RoleRun) -> None:
    run, lock_path = role_run
    out = run()
    assert not out.startswith("rc=0"), out[-3000:]
    assert "Take the image build lock" in out
    assert "Look for the base image" in out, out[-5000:]  # resolving ran under the lock
    assert "Release the image build lock" in out
    assert lock_path.parent.is_dir()
    assert not lock_path.exists(), out[-3000:]


def test_role_waits_then_names_the_holder_and_leaves_its_lock(role_run: RoleRun) -> None:
    run, lock_path = role_run
    lock_path.parent.mkdir(parents=True)
    acquire(lock_path, "tok-other")
    held = holder(lock_path) | {"host": "other-controller", "pid": 4242}
    lock_path.write_text(json.dumps(held))
    out = run(trainer_image_lock_wait=1)
    assert not out.startswith("rc=0"), out[-3000:]
    assert "is held by ansible-playbook pid 4242 on other-controller" in out, out[-3000:]
    assert "Look for the base image" not in out
    assert holder(lock_path) == held


def test_role_takes_over_a_stale_lock(role_run: RoleRun) -> None:
    run, lock_path = role_run
    lock_path.parent.mkdir(parents=True)
    acquire(lock_path, "tok-old")
    old = holder(lock_path) | {"host": "other-controller", "expires": time.time() - 1800}
    lock_path.write_text(json.dumps(old))
    out = run(trainer_image_lock_wait=1, trainer_image_lock_stale_after=7200)
    assert "took over the stale build lock of ansible-playbook pid 42 on other-controller" in out
    assert "Look for the base image" in out
    assert not lock_path.exists(), out[-3000:]


def test_role_breaks_the_lock_of_a_dead_run_on_this_controller(role_run: RoleRun) -> None:
    run, lock_path = role_run
    lock_path.parent.mkdir(parents=True)
    gone = subprocess.Popen(["true"])  # only its pid matters: a process that has ended
    gone.wait()
    acquire(lock_path, "tok-dead")
    here = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    lock_path.write_text(json.dumps(holder(lock_path) | {"host": here, "pid": gone.pid}))
    out = run(trainer_image_lock_wait=1)
    assert f"took over the stale build lock of ansible-playbook pid {gone.pid} on {here}" in out
    assert not lock_path.exists(), out[-3000:]
