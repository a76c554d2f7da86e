"""Forensics on real processes: a 2-rank gloo run where one rank waits outside the collective
the other waits in, dumped with the real py-spy; the diagnosis names it and where it is."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from time_bounds import within

from ddpfleet_agent import forensics
from ddpfleet_agent.forensics import collect, compact, diagnose_line, write_index, write_ranks
from ddpfleet_agent.ranks import children
from ddpfleet_agent.stacks import diagnose, where

# Rank ODD_RANK stops before the all-reduce of step 2, in a function of its own; the other
# rank waits for it inside all_reduce. Lines are counted by the asserts below.
PROGRAM = """\
import os, time
import torch
import torch.distributed as dist


def slow_step():
    time.sleep(600)


def main():
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for step in range(1000):
        if dist.get_rank() == int(os.environ["ODD_RANK"]) and step == 2:
            slow_step()
        dist.all_reduce(t)


main()
"""


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    """torchrun with 2 gloo ranks on this machine, rank 1 in slow_step, rank 0 in all_reduce."""
    tmp = tmp_path_factory.mktemp("gloo")
    (tmp / "prog.py").write_text(PROGRAM)
    env = {**os.environ, "ODD_RANK": "1", "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-port", str(_free_port()), str(tmp / "prog.py")]  # fmt: skip
    launcher = subprocess.Popen(args, cwd=tmp, env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    pids: list[int] = []
    try:
        pids = _rank_pids(launcher.pid, 2)
        deadline = time.monotonic() + 180  # until rank 1 sits in slow_step (a loaded host)
        while time.monotonic() < deadline:
            got = collect(pids, "h0", str(tmp), timeout=10)
            if any(r.get("where", {}).get("what") == "slow_step" for r in got["ranks"]):
                break
            time.sleep(1)
        else:
            raise AssertionError(f"rank 1 never reached slow_step: {got}")
        yield {"pids": pids, "tmp": tmp}
    finally:
        # torchrun starts each rank in a session of its own: killing the launcher's group
        # alone left the ranks running after the tests (found as orphans beside later tiers)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(10)


def _rank_pids(launcher: int, n: int) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = [p for p in children(launcher) if forensics.rank_of(p) is not None]
        if len(pids) == n:
            return pids
        time.sleep(0.3)
    raise AssertionError("torchrun did not start its ranks")


def test_the_rank_outside_the_collective_is_named_with_its_location(gloo_run):
    got = collect(gloo_run["pids"], "h0", str(gloo_run["tmp"]))
    by_rank = {r["rank"]: r for r in got["ranks"]}
    assert by_rank[0]["where"] == {"what": "all_reduce", "at": "prog.py:16", "io": False}
    assert by_rank[1]["where"] == {"what": "slow_step", "at": "prog.py:7", "io": False}
    line = diagnose_line([compact(got)], {})
    assert line == (
        "rank 0 wait in all_reduce (prog.py:16); "
        "rank 1 (h0) in slow_step (prog.py:7): the odd one out"
    )
    assert got["host_state"]["storage"]["answered"] is True
    assert all(r["fds"] and r["fds"] > 3 for r in got["ranks"])


def test_the_bundle_is_plain_text_per_rank_and_an_index(gloo_run, tmp_path):
    got = collect(gloo_run["pids"], "h0", "")
    write_ranks(tmp_path, got)
    line = write_index(tmp_path, {"run_id": "r1", "attempt": "a1"}, [compact(got)], {})
    text = (tmp_path / "rank-1.txt").read_text()
    assert text.startswith("rank 1 on h0, pid ")
    assert "where: slow_step (prog.py:7)" in text
    assert '"MainThread"' in text
    assert "    slow_step (prog.py:7)" in text
    assert json.loads((tmp_path / "rank-0.json").read_text())["threads"][0]["frames"]
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["diagnosis"] == line
    assert [(r["rank"], r["host"], r["file"]) for r in index["ranks"]] == [
        (0, "h0", "rank-0.txt"), (1, "h0", "rank-1.txt")]  # fmt: skip


def test_a_stopped_rank_is_dumped_and_named(gloo_run):
    pid = gloo_run["pids"][0]  # rank 0 or 1: whichever, it is the one stopped
    rank = forensics.rank_of(pid)
    os.kill(pid, signal.SIGSTOP)
    try:
        # SIGSTOP takes effect asynchronously: on a busy 2-core host /proc still read R right
        # after the kill (a fresh-clone rehearsal of .ci/run, 2026-11-30). The rank under test
        # is one that is stopped.
        deadline = time.monotonic() + 10
        while forensics.proc_state(pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        got = collect(gloo_run["pids"], "h0", "")
    finally:
        os.kill(pid, signal.SIGCONT)
    stopped = next(r for r in got["ranks"] if r["rank"] == rank)
    assert stopped["state"] == "T"
    assert stopped["where"]["what"].startswith("stopped (process state T) in ")
    assert f"rank {rank} (h0) is stopped (process state T) in " in diagnose_line([compact(got)], {})


def test_a_rank_that_cannot_be_dumped_in_time_is_recorded_and_the_bound_holds(
    gloo_run, tmp_path, monkeypatch
):
    slow = tmp_path / "py-spy"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setattr(forensics, "py_spy", lambda: str(slow))
    t0 = time.monotonic()
    got = collect(gloo_run["pids"], "h0", "", timeout=1.0)
    assert time.monotonic() - t0 < within(3.0)
    assert {r["error"] for r in got["ranks"]} == {"py-spy did not finish within 1 s"}
    assert "no stacks (py-spy did not finish within 1 s)" in diagnose_line([compact(got)], {})


def test_ranks_are_found_by_their_rank_and_not_their_loader_workers():
    # a "rank" (RANK set) with a forked child that inherits RANK, as a data-loader worker does
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)\n"
    rank = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "RANK": "7"})
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if children(rank.pid):
                break
            time.sleep(0.1)
        worker = children(rank.pid)[0]
        assert forensics.rank_of(worker) == 7
        found = forensics.rank_pids()
        assert rank.pid in found
        assert worker not in found
    finally:
        for pid in [*children(rank.pid), rank.pid]:
            os.kill(pid, signal.SIGKILL)
        rank.wait(10)


def test_native_unwinding_too_slow_falls_back_to_the_python_frames(gloo_run, tmp_path, monkeypatch):
    # a py-spy whose --native dump never finishes (torch's libraries on a loaded host)
    slow = tmp_path / "py-spy"
    real = forensics.py_spy()
    slow.write_text(f'#!/bin/sh\ncase "$*" in *--native*) sleep 30;; esac\nexec {real} "$@"\n')
    slow.chmod(0o755)
    monkeypatch.setattr(forensics, "py_spy", lambda: str(slow))
    t0 = time.monotonic()
    got = collect(gloo_run["pids"], "h0", "", timeout=3.0)
    assert time.monotonic() - t0 < within(4.0)
    assert {r["where"]["what"] for r in got["ranks"]} == {"all_reduce", "slow_step"}, got


def _thread(*frames: tuple[str, str, int], name: str = "MainThread") -> dict:
    return {"thread_name": name, "frames": [
        {"name": n, "filename": f, "short_filename": f.rsplit("/", 1)[-1] if "torch" not in f
         else f[f.index("torch"):], "line": line} for n, f, line in frames]}  # fmt: skip


C10D = "/v/site-packages/torch/distributed/distributed_c10d.py"
AUTOGRAD = "/v/site-packages/torch/autograd/__init__.py"
LOADER = "/v/site-packages/torch/utils/data/dataloader.py"


@pytest.mark.parametrize(
    ("frames", "state", "what", "at"),
    [
        ([("all_reduce", C10D, 3913), ("step", "/v/site-packages/trainer/engine.py", 142)],
         "S", "all_reduce", "engine.py:142"),
        ([("_engine_run_backward", "/v/site-packages/torch/autograd/graph.py", 829),
          ("backward", AUTOGRAD, 364), ("train", "/c/train.py", 40)], "S", "backward",
         "train.py:40"),
        ([("_next_data", LOADER, 700), ("__next__", LOADER, 650), ("epoch", "/c/run.py", 9)],
         "D", "uninterruptible I/O (process state D) in DataLoader.__next__", "run.py:9"),
        ([("slow", "/c/hook.py", 6)], "T", "stopped (process state T) in slow", "hook.py:6"),
    ],
)  # fmt: skip
def test_where_a_rank_waits(frames, state, what, at):
    got = where([_thread(("sleep", "libc.so.6", 0), name="pin_memory"), _thread(*frames)], state)
    assert (got["what"], got["at"]) == (what, at)


def test_a_host_without_stacks_is_named_and_no_rank_is_blamed_for_it():
    waiting = {"what": "all_reduce", "at": "engine.py:142", "io": False}
    ranks = [{"rank": r, "host": "n1", "where": waiting} for r in (0, 1)]
    assert diagnose(ranks, {"n3": [4, 5]}) == (
        "ranks 0,1 wait in all_reduce (engine.py:142); ranks 4,5 of n3: no stacks "
        "(its agent did not answer)"
    )
