"""roles/host_lock/files/ddpfleet_lock.py, ddpfleet's one lock (the image build lock and a
run_id's launch lock), run for real: as the program the roles run on the node, and forked
many times at once on one real file for the takeover race."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from plugin_loader import load_plugin
from time_bounds import within

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "roles" / "host_lock" / "files" / "ddpfleet_lock.py"
node = load_plugin("ddpfleet_lock_node", "roles/host_lock/files/ddpfleet_lock.py")


def lock(*args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, str(LOCK), *args],
        capture_output=True,
        text=True,
        timeout=within(60),
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {"err": proc.stderr}


def acquire(path: Path, token: str, *extra: str, lease: float = 600) -> tuple[int, dict]:
    return lock("acquire", "--path", str(path), "--token", token, "--host", "ctl", "--pid", "42",
                "--lease", str(lease), *extra)  # fmt: skip


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "trainer_image.lock"


def holder(path: Path) -> dict:
    return json.loads(path.read_text())


def expire(path: Path, ago: float = 10.0) -> None:
    """Make the lock's lease run out ``ago`` s ago, as if its holder stopped renewing."""
    old = holder(path)
    path.write_text(json.dumps({**old, "expires": time.time() - ago}))


def test_a_free_lock_is_taken_with_host_pid_time_and_lease(path: Path) -> None:
    before = time.time()
    rc, out = acquire(path, "tok-a", "--attempt", "a1", lease=600)
    assert (rc, out["acquired"], out["took_over"]) == (0, True, None)
    held = holder(path)
    assert (held["host"], held["pid"], held["token"], held["attempt"]) == ("ctl", 42, "tok-a", "a1")
    assert before <= held["time"] <= time.time()
    assert held["expires"] == pytest.approx(held["time"] + 600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_held_lock_is_refused_and_names_its_holder_without_its_token(path: Path) -> None:
    acquire(path, "tok-a")
    rc, out = acquire(path, "tok-b")
    assert rc == 3
    assert (out["holder"]["host"], out["holder"]["pid"]) == ("ctl", 42)
    assert "token" not in out["holder"]
    assert holder(path)["token"] == "tok-a"


def test_acquiring_again_with_the_own_token_is_a_no_op(path: Path) -> None:
    acquire(path, "tok-a")
    assert acquire(path, "tok-a")[0] == 0
    assert holder(path)["token"] == "tok-a"


def test_only_the_holder_releases(path: Path) -> None:
    acquire(path, "tok-a")
    assert lock("release", "--path", str(path), "--token", "tok-b")[1]["released"] is False
    assert path.exists()
    assert lock("release", "--path", str(path), "--token", "tok-a") == (
        0, {"released": True, "holder": None},
    )  # fmt: skip
    assert not path.exists()


def test_a_lock_whose_lease_ran_out_is_taken_over(path: Path) -> None:
    acquire(path, "tok-old")
    expire(path)
    rc, out = acquire(path, "tok-new")
    assert rc == 0
    assert out["took_over"]["pid"] == 42
    assert out["took_over"]["left_s"] <= -10
    assert holder(path)["token"] == "tok-new"


def test_a_renewed_lease_is_not_stale(path: Path) -> None:
    take = ["acquire", "--path", str(path), "--host", "ctl", "--pid", "1", "--lease", "2"]
    assert node.main([*take, "--token", "tok-a"]) == 0  # in-process: no interpreter start-up
    time.sleep(1.2)
    assert node.main(["renew", "--path", str(path), "--token", "tok-a", "--lease", "2"]) == 0
    time.sleep(1.2)  # 2.4 s after it was taken: stale without the renewal
    assert node.main([*take, "--token", "tok-b"]) == 3
    assert holder(path)["token"] == "tok-a"
    assert holder(path)["expires"] > time.time()


def test_renewing_a_lock_taken_over_fails_and_leaves_it(path: Path) -> None:
    acquire(path, "tok-a")
    expire(path)
    acquire(path, "tok-b")
    rc, out = lock("renew", "--path", str(path), "--token", "tok-a", "--lease", "600")
    assert (rc, out["renewed"]) == (3, False)
    assert "token" not in out["holder"]
    assert holder(path)["token"] == "tok-b"


def test_a_record_without_a_lease_expires_lease_s_after_it_was_taken(path: Path) -> None:
    path.write_text(json.dumps({"host": "old", "pid": 7, "time": time.time() - 100, "token": "t"}))
    assert acquire(path, "tok-b", lease=600)[0] == 3
    assert acquire(path, "tok-b", lease=60)[0] == 0


def test_break_token_takes_over_only_that_lock(path: Path) -> None:
    acquire(path, "tok-dead")
    assert acquire(path, "tok-b", "--break-token", "tok-other")[0] == 3
    assert acquire(path, "tok-b", "--break-token", "tok-dead")[0] == 0
    assert holder(path)["token"] == "tok-b"


def test_show_gives_the_holder_and_its_token_to_the_controller(path: Path) -> None:
    assert lock("show", "--path", str(path)) == (0, {"holder": None})
    acquire(path, "tok-a")
    out = lock("show", "--path", str(path))[1]["holder"]
    assert (out["host"], out["pid"], out["token"]) == ("ctl", 42, "tok-a")


@pytest.mark.parametrize(("age_s", "rc"), [(0, 3), (3 * 3600, 0)])
def test_an_unreadable_lock_counts_as_held_since_it_was_written(
    path: Path, age_s: int, rc: int
) -> None:
    path.write_text("{half a lock")
    old = time.time() - age_s
    os.utime(path, (old, old))
    assert acquire(path, "tok-b", lease=7200)[0] == rc


def test_a_planted_link_is_not_followed(path: Path) -> None:
    target = path.parent / "elsewhere"
    path.symlink_to(target)
    assert acquire(path, "tok-a")[0] == 3  # held (unreadable) until its lease runs out
    assert not target.exists()


@pytest.mark.parametrize("args", [["--token", ""], ["--token", "t", "--lease", "0"]])
def test_bad_usage_is_one_line_and_exit_2(path: Path, args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(LOCK), "renew", "--path", str(path), "--lease", "5", *args],
        capture_output=True, text=True, timeout=within(60), check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "must" in proc.stderr.splitlines()[-1]


def test_exactly_one_of_many_concurrent_callers_wins_a_free_lock(path: Path) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: acquire(path, f"tok-{i}")[0], range(8)))
    assert sorted(results) == [0] + [3] * 7


# --- the takeover race: processes forked at once on one real file ------------------------


def _take_over(path: str, token: str, start: multiprocessing.synchronize.Barrier) -> None:
    start.wait()
    with open(os.devnull, "w") as quiet:
        sys.stdout = quiet
        code = node.main(["acquire", "--path", path, "--token", token, "--host", "ctl",
                          "--pid", "1", "--lease", "600"])  # fmt: skip
    os._exit(code)


def test_exactly_one_of_many_processes_takes_over_a_stale_lock(path: Path) -> None:
    """Check-then-unlink lets two callers that both saw the stale lock both take it (the
    second unlinks the first one's fresh lock); the guard lets exactly one, every time."""
    forks = multiprocessing.get_context("fork")
    for round_ in range(40):
        stale = {"host": "gone", "pid": 1, "time": 0.0, "expires": 1.0, "token": "dead"}
        path.write_text(json.dumps(stale))
        start = forks.Barrier(4)
        procs = [forks.Process(target=_take_over, args=(str(path), f"t{round_}-{i}", start))
                 for i in range(4)]  # fmt: skip
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(within(30))
        winners = [f"t{round_}-{i}" for i, p in enumerate(procs) if p.exitcode == 0]
        assert sorted(p.exitcode for p in procs) == [0, 3, 3, 3], (round_, winners)
        assert holder(path)["token"] == winners[0]
