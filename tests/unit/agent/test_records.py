"""The agent's reads of the shared storage are bounded: a path that really blocks (a FIFO with
no writer blocks open() as a hard NFS mount whose server died does) costs one bounded wait."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from time_bounds import within

from ddpfleet_agent import ending
from ddpfleet_agent.cli import parse_args
from ddpfleet_agent.machine import Standing
from ddpfleet_agent.records import Records
from ddpfleet_agent.supervise import Agent


def release_fifo(path: Path, mode: int) -> None:
    """Open the other end of a FIFO without waiting: whoever waits on it goes on."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, mode | os.O_NONBLOCK))


@pytest.fixture
def blocked(tmp_path: Path) -> Iterator[Path]:
    """progress.json and summary.json as FIFOs: opening either for reading blocks."""
    for name in ("progress.json", "summary.json"):
        os.mkfifo(tmp_path / name)
    yield tmp_path
    for name in ("progress.json", "summary.json"):  # let the readers left waiting go
        release_fifo(tmp_path / name, os.O_WRONLY)


def test_a_read_of_storage_that_does_not_answer_gives_up_within_its_bound(
    blocked: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    records = Records(str(blocked), "h1", read_timeout=0.5)
    started = time.monotonic()
    assert records.progress() == {}
    assert records.summary() == {}  # the storage is known silent: no second wait
    assert time.monotonic() - started < within(1.5)
    assert records.storage_silent
    err = capfd.readouterr().err
    assert err.count("shared storage did not answer") == 1, err
    assert "a read of progress.json within 0.5 s" in err


def test_a_read_of_storage_that_answers_is_the_record(tmp_path: Path) -> None:
    (tmp_path / "progress.json").write_text(json.dumps({"step": 3}))
    records = Records(str(tmp_path), "h1")
    assert records.progress() == {"step": 3}
    assert records.summary() == {}  # missing: nothing written yet, not silent storage
    assert not records.storage_silent


def test_a_host_that_lost_the_store_and_the_storage_ends_without_waiting_on_it(
    blocked: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Node rank 0's host gone with the store and the storage: the others must not hang on
    the run directory while they end (issue 27 item 3)."""

    monkeypatch.setattr(ending, "PROGRESS_EVERY", 0.05)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the agent's heartbeat directory
    args = ["--run-dir", str(blocked), "--run-id", "t1", "--hosts", "h0,h1", "--host", "h1",
            "--node-rank", "1", "--store", "127.0.0.1:1", "--attempt", "a1", "--key-file", "k",
            "--storage-timeout", "0.5", "--", "true"]  # fmt: skip
    agent = Agent(parse_args(args))
    agent.cfg.settle = 0.05
    failure = {"host": "h0", "rank": 0, "reason": "host h0 silent"}
    started = time.monotonic()
    agent.ending._write_summary("failed", Standing(failure, store_ok=False))
    assert time.monotonic() - started < within(3)
    assert agent.records.storage_silent
    assert agent.records.flush(1)  # nothing was queued for the silent storage


def plant_fifo(path: Path) -> None:
    """Put a FIFO at path (over a file there): opening it blocks until the other end opens."""
    fifo = path.with_name(f".fifo-{path.name}")
    os.mkfifo(fifo)
    os.replace(fifo, path)


def test_storage_and_store_host_gone_the_other_agent_ends_within_the_bound_and_says_so_locally(
    cluster, tmp_path: Path
) -> None:
    """Node rank 0's host dies with the shared storage (its store gone; the run directory's
    reads and h1's exit record block): h1's agent ends its rank and exits within two storage
    bounds of losing the store, and its host-local fallback holds its log and the exit record
    naming the storage (issue 27 item 3)."""
    local = tmp_path / "local"
    local.mkdir()
    (local / "h0.exit").write_text('{"attempt": "a0", "outcome": "completed"}')  # an earlier one
    c = cluster(2, **{"storage-timeout": 2, "fallback-dir": str(local)})
    c.start({0: "run:60", 1: "run:60"})
    c.heartbeat_ready(1)
    run = c.run_dir
    blocking = [run / "progress.json", run / "summary.json"]
    exit_tmp = run / "nodes" / f".h1.exit.tmp-{c.procs[1].pid}"  # write_bytes_atomic's temp
    try:
        for path in blocking:
            plant_fifo(path)
        os.mkfifo(exit_tmp)
        c.kill_host(0)
        lost = time.monotonic()
        code = c.procs[1].wait(30)
        took = time.monotonic() - lost
    finally:
        for path in blocking:
            release_fifo(path, os.O_WRONLY)
        release_fifo(exit_tmp, os.O_RDONLY)
    print(f"\nstore and storage gone -> h1's agent exited in {took:.1f} s")
    assert code == 1, c.output()
    assert took < within(2 * 2 + 8), c.output()  # two bounds; slack for a tick and a busy machine
    rec = json.loads((local / "h1.exit").read_text())
    assert (rec["outcome"], rec["failure"]["host"]) == ("failed", "h0"), rec
    storage = f"the shared storage did not answer within 2 s ({run})"
    assert rec["storage"] == storage
    assert rec["cause"].startswith(f"{storage}; run t1 failed: host h0 rank 0: lost the conn")
    assert "run t1 failed: host h0" in (local / "h1.log").read_text()
    assert not (run / "nodes" / "h1.exit").exists()  # the shared copy never got through
    assert not (local / "h0.exit").exists()  # h0's agent removed it as it started, then died
