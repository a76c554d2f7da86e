"""The registry host's image build lock (roles/trainer_image/files/ddpfleet_image_lock.py),
run as the program the role runs on the registry host."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "roles" / "trainer_image" / "files" / "ddpfleet_image_lock.py"
RoleRun = tuple[Callable[..., str], Path]


def lock(*args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, str(LOCK), *args], capture_output=True, text=True, timeout=60, check=False
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {"err": proc.stderr}


def acquire(path: Path, token: str, *extra: str) -> tuple[int, dict]:
    return lock("acquire", "--path", str(path), "--token", token, "--host", "ctl", "--pid", "42",
                *extra)  # fmt: skip


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "trainer_image.lock"


def holder(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_free_lock_is_taken_with_host_pid_and_time(path: Path) -> None:
    before = time.time()
    rc, out = acquire(path, "tok-a")
    assert (rc, out["acquired"], out["took_over"]) == (0, True, None)
    held = holder(path)
    assert (held["host"], held["pid"], held["token"]) == ("ctl", 42, "tok-a")
    assert before <= held["time"] <= time.time()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_held_lock_is_refused_and_names_its_holder_without_its_token(path: Path) -> None:
    acquire(path, "tok-a")
    rc, out = acquire(path, "tok-b")
    assert rc == 3
    assert out["holder"]["host"] == "ctl"
    assert out["holder"]["pid"] == 42
    assert "token" not in out["holder"]
    assert holder(path)["token"] == "tok-a"


def test_acquiring_again_with_the_own_token_is_a_no_op(path: Path) -> None:
    acquire(path, "tok-a")
    assert acquire(path, "tok-a")[0] == 0
    assert holder(path)["token"] == "tok-a"


def test_only_the_holder_releases(path: Path) -> None:
    acquire(path, "tok-a")
    rc, out = lock("release", "--path", str(path), "--token", "tok-b")
    assert (rc, out["released"]) == (0, False)
    assert path.exists()
    rc, out = lock("release", "--path", str(path), "--token", "tok-a")
    assert (rc, out["released"]) == (0, True)
    assert not path.exists()


def test_releasing_a_free_lock_is_fine(path: Path) -> None:
    assert lock("release", "--path", str(path), "--token", "tok-a") == (
        0,
        {"released": False, "holder": None},
    )


def test_a_lock_older_than_stale_after_is_taken_over(path: Path) -> None:
    acquire(path, "tok-old")
    old = holder(path)
    old["time"] -= 3 * 3600
    path.write_text(json.dumps(old))
    rc, out = acquire(path, "tok-new", "--stale-after", "7200")
    assert rc == 0
    assert out["took_over"]["pid"] == 42
    assert out["took_over"]["age_s"] >= 3 * 3600
    assert holder(path)["token"] == "tok-new"


def test_a_fresh_lock_is_not_stale(path: Path) -> None:
    acquire(path, "tok-a")
    assert acquire(path, "tok-b", "--stale-after", "7200")[0] == 3


def test_break_token_takes_over_only_that_lock(path: Path) -> None:
    acquire(path, "tok-dead")
    assert acquire(path, "tok-b", "--break-token", "tok-other")[0] == 3
    rc, _ = acquire(path, "tok-b", "--break-token", "tok-dead")
    assert rc == 0
    assert holder(path)["token"] == "tok-b"


def test_show_gives_the_holder_and_its_token_to_the_controller(path: Path) -> None:
    assert lock("show", "--path", str(path)) == (0, {"holder": None})
    acquire(path, "tok-a")
    rc, out = lock("show", "--path", str(path))
    assert rc == 0
    assert (out["holder"]["host"], out["holder"]["pid"], out["holder"]["token"]) == (
        "ctl",
        42,
        "tok-a",
    )


def test_a_waiter_gets_the_lock_when_the_holder_releases(path: Path) -> None:
    acquire(path, "tok-a")
    releaser = threading.Timer(1.0, lock, ("release", "--path", str(path), "--token", "tok-a"))
    releaser.start()
    try:
        rc, out = acquire(path, "tok-b", "--wait", "30", "--poll", "0.2")
    finally:
        releaser.join()
    assert (rc, out["waited"]) == (0, True)
    assert holder(path)["token"] == "tok-b"


def test_a_waiter_gives_up_after_wait(path: Path) -> None:
    acquire(path, "tok-a")
    start = time.monotonic()
    rc, out = acquire(path, "tok-b", "--wait", "1", "--poll", "0.2")
    assert rc == 3
    assert 1.0 <= time.monotonic() - start < 20
    assert out["holder"]["host"] == "ctl"


def test_exactly_one_of_many_concurrent_callers_wins(path: Path) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: acquire(path, f"tok-{i}")[0], range(8)))
    assert sorted(results) == [0] + [3] * 7
    assert holder(path)["token"] in {f"tok-{i}" for i in range(8)}


@pytest.mark.parametrize(("age_s", "rc"), [(0, 3), (3 * 3600, 0)])
def test_an_unreadable_lock_counts_as_held_since_it_was_written(
    path: Path, age_s: int, rc: int
) -> None:
    path.parent.mkdir(parents=True)
    path.write_text("{half a lock")
    old = time.time() - age_s
    os.utime(path, (old, old))
    assert acquire(path, "tok-b", "--stale-after", "7200")[0] == rc


def test_an_empty_token_is_bad_usage(path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(LOCK), "release", "--path", str(path), "--token", ""],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--token must not be empty" in proc.stderr


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
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
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
    old = holder(lock_path) | {"host": "other-controller", "time": time.time() - 9000}
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
