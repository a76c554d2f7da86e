"""roles/host_lock/action_plugins/ddpfleet_lock.py, as trainer_run takes a run_id's launch lock
(as the storage's owner), with its node-side commands run for real (/bin/sh, python3) on a
local directory."""

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

lock = load_plugin("ddpfleet_lock", "roles/host_lock/action_plugins/ddpfleet_lock.py")
OWNER = os.getuid() if os.getuid() else 65534  # as root the commands drop to nobody
# a lock taken "now", waits of 0.3 and 10 s for a holder to let go
pytestmark = pytest.mark.wallclock


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
    assert (got["changed"], got["acquired"]) == (True, True)
    held = json.loads((runs / "r1.lock").read_text())
    assert (held["host"], held["pid"], held["attempt"], held["token"]) == (
        socket.gethostname(), os.getpid(), "a1", got["token"],
    )  # fmt: skip
    assert abs(held["time"] - time.time()) < 5
    if os.getuid() == 0:
        assert (runs / "r1.lock").stat().st_uid == OWNER  # written as the storage's owner


def test_a_held_lock_is_waited_for_then_refused_naming_the_holder(runs: Path) -> None:
    assert action(runs / "r1.lock", os.getpid())["acquired"]
    other = action(runs / "r1.lock", os.getpid() + 1, timeout=0.3)
    assert other["acquired"] is False
    assert (other["holder"]["host"], other["holder"]["pid"]) == (socket.gethostname(), os.getpid())
    assert json.loads((runs / "r1.lock").read_text())["pid"] == os.getpid()  # untouched


def test_the_second_train_yml_gets_the_lock_once_the_first_releases_it(runs: Path) -> None:
    assert action(runs / "r1.lock", os.getpid())["acquired"]
    release = threading.Timer(0.5, (runs / "r1.lock").unlink)  # the first one is done
    release.start()
    got = action(runs / "r1.lock", os.getpid() + 1, timeout=10)
    release.join()
    assert got["acquired"] is True
    assert got["waited"] >= 0.4
    assert json.loads((runs / "r1.lock").read_text())["pid"] == os.getpid() + 1


def test_a_lock_of_a_dead_train_yml_on_this_controller_is_taken_over(runs: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert action(runs / "r1.lock", dead.pid)["acquired"]
    got = action(runs / "r1.lock", os.getpid(), timeout=0.3)
    assert got["acquired"] is True
    assert got["took_over"]["why"] == f"its ansible-playbook (pid {dead.pid}) is gone"


def test_a_lock_of_another_controller_is_taken_over_once_its_lease_ran_out(runs: Path) -> None:
    old = {"host": "laptop", "pid": 1, "time": time.time() - 1000, "expires": time.time() - 100}
    (runs / "r1.lock").write_text(json.dumps({**old, "token": "t"}))
    got = action(runs / "r1.lock", os.getpid(), timeout=0.3)
    assert re.fullmatch(r"its lease ran out 1\d\d s ago", got["took_over"]["why"]), got
    (runs / "r2.lock").write_text(json.dumps({**old, "expires": time.time() + 100, "token": "t"}))
    assert action(runs / "r2.lock", os.getpid(), timeout=0.3)["acquired"] is False


def test_renewal_extends_the_lease_and_fails_once_the_lock_was_taken_over(runs: Path) -> None:
    token = action(runs / "r1.lock", os.getpid(), lease=60)["token"]
    renewed = action(runs / "r1.lock", os.getpid(), state="renewed", token=token, lease=900)
    assert renewed["changed"] is True
    assert json.loads((runs / "r1.lock").read_text())["expires"] > time.time() + 800
    (runs / "r1.lock").write_text(json.dumps({"host": "laptop", "pid": 1, "time": time.time(),
                                              "token": "theirs"}))  # fmt: skip
    lost = action(runs / "r1.lock", os.getpid(), state="renewed", token=token, lease=900)
    assert lost["failed"] is True
    assert "is no longer ours: held by ansible-playbook pid 1 on laptop" in lost["msg"]


def test_release_leaves_another_train_yml_s_lock_alone(runs: Path) -> None:
    token = action(runs / "r1.lock", os.getpid())["token"]
    assert action(runs / "r1.lock", os.getpid(), state="absent", token="x")["changed"] is False
    assert (runs / "r1.lock").exists()
    assert action(runs / "r1.lock", os.getpid(), state="absent", token=token)["changed"] is True
    assert not (runs / "r1.lock").exists()


def test_without_become_the_node_side_says_it_needs_root(runs: Path) -> None:
    def unprivileged(cmd: str, sudoable: bool = True) -> dict:
        return node_shell(cmd, sudoable=False)

    task = mock.MagicMock(async_val=0, check_mode=False)
    task.args = {"path": str(runs / "r1.lock"), "owner_uid": OWNER, "owner_gid": OWNER}
    plugin = lock.ActionModule(task, mock.MagicMock(), mock.MagicMock(), None, None, None)
    with mock.patch.object(plugin, "_low_level_execute_command", side_effect=unprivileged):
        got = plugin.run(task_vars={})
    assert got["failed"] is True
    assert "needs root on the node to act as the storage's owner" in got["msg"]
