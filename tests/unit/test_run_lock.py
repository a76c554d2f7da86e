"""roles/trainer_run/action_plugins/ddpfleet_run_lock.py: the launch lock of a run_id, with its
node-side commands run for real (/bin/sh, python3, O_EXCL) on a local directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from plugin_loader import load_plugin, node_shell

lock = load_plugin("ddpfleet_run_lock", "roles/trainer_run/action_plugins/ddpfleet_run_lock.py")
OWNER = os.getuid() if os.getuid() else 65534  # as root the commands drop to nobody


@pytest.fixture
def runs() -> Iterator[Path]:
    """A runs/ directory of the owner's, as on the shared storage (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="ddpfleet-lock-"))
    path.chmod(0o755)
    os.chown(path, OWNER, OWNER)
    yield path
    shutil.rmtree(path)


def action(path: Path, pid: int, **args) -> dict:
    """Run the action as a train.yml whose ansible-playbook process is `pid`."""
    task = mock.MagicMock(async_val=0, check_mode=False)
    task.args = {"path": str(path), "owner_uid": OWNER, "owner_gid": OWNER, "poll": 0.05, **args}
    plugin = lock.ActionModule(task, mock.MagicMock(), mock.MagicMock(), None, None, None)

    with (
        mock.patch.object(plugin, "_low_level_execute_command", side_effect=node_shell),
        mock.patch.object(lock.os, "getppid", return_value=pid),
    ):
        return plugin.run(task_vars={})


def test_a_free_lock_is_taken_with_who_holds_it(runs: Path) -> None:
    got = action(runs / "r1.lock", os.getpid(), attempt="a1")
    assert got["changed"] is True
    held = json.loads((runs / "r1.lock").read_text())
    assert (held["controller"], held["pid"], held["attempt"]) == (
        socket.gethostname(), os.getpid(), "a1",
    )  # fmt: skip
    assert abs(held["time"] - time.time()) < 5
    if os.getuid() == 0:
        assert (runs / "r1.lock").stat().st_uid == OWNER  # written as the storage's owner


def test_a_held_lock_is_waited_for_then_refused_naming_the_holder(runs: Path) -> None:
    assert action(runs / "r1.lock", os.getpid())["changed"]
    other = action(runs / "r1.lock", os.getpid() + 1, timeout=0.3)
    assert other["failed"] is True
    assert f"is held by train.yml on {socket.gethostname()} (pid {os.getpid()})" in other["msg"]
    assert json.loads((runs / "r1.lock").read_text())["pid"] == os.getpid()  # untouched


def test_the_second_train_yml_gets_the_lock_once_the_first_releases_it(runs: Path) -> None:
    assert action(runs / "r1.lock", os.getpid())["changed"]
    release = threading.Timer(0.5, (runs / "r1.lock").unlink)  # the first one is done
    release.start()
    got = action(runs / "r1.lock", os.getpid() + 1, timeout=10)
    release.join()
    assert got["changed"] is True
    assert got["waited"] >= 0.4
    assert json.loads((runs / "r1.lock").read_text())["pid"] == os.getpid() + 1


def test_a_lock_of_a_dead_train_yml_on_this_controller_is_taken_over(runs: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert action(runs / "r1.lock", dead.pid)["changed"]
    got = action(runs / "r1.lock", os.getpid(), timeout=0.3)
    assert got["changed"] is True
    assert f"its train.yml (pid {dead.pid}) is gone" in got["took_over"]


def test_an_old_lock_of_another_controller_is_taken_over_a_young_one_is_not(runs: Path) -> None:
    old = {"controller": "laptop", "pid": 1, "time": time.time() - 1000, "attempt": ""}
    (runs / "r1.lock").write_text(json.dumps(old))
    got = action(runs / "r1.lock", os.getpid(), timeout=0.3, stale_after=900)
    assert re.search(r"it is 10\d\d s old", got["took_over"]), got
    young = {**old, "time": time.time() - 10}
    (runs / "r2.lock").write_text(json.dumps(young))
    assert action(runs / "r2.lock", os.getpid(), timeout=0.3, stale_after=900)["failed"]


def test_release_leaves_another_train_yml_s_lock_alone(runs: Path) -> None:
    assert action(runs / "r1.lock", os.getpid())["changed"]
    assert action(runs / "r1.lock", os.getpid() + 1, state="absent")["changed"] is False
    assert (runs / "r1.lock").exists()
    assert action(runs / "r1.lock", os.getpid(), state="absent")["changed"] is True
    assert not (runs / "r1.lock").exists()


def test_a_planted_link_is_not_followed(runs: Path) -> None:
    target = runs / "elsewhere"
    (runs / "r1.lock").symlink_to(target)
    got = action(runs / "r1.lock", os.getpid(), timeout=0.3)
    assert not target.exists()  # O_EXCL|O_NOFOLLOW: nothing created through the link
    assert got.get("took_over", "").startswith("a stale lock (unreadable)") or got.get("failed")
