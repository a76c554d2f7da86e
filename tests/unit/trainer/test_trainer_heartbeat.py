"""The heartbeat contract the agent reads: a thread writes, the training loop only marks."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainer.metrics import HEARTBEAT_DIR_ENV, HEARTBEAT_INTERVAL_ENV, LOG, Heartbeat

FIELDS = {
    "rank", "local_rank", "pid", "host", "time", "step", "total_steps", "epoch", "phase",
    "progress_time", "loss", "images_per_sec",
}  # fmt: skip


def read(path: Path) -> dict:
    return json.loads(path.read_text())


pytestmark = pytest.mark.wallclock  # the writer thread's period, in seconds


@pytest.fixture(autouse=True)
def no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run standalone unless they set the agent's variables themselves."""
    monkeypatch.delenv(HEARTBEAT_DIR_ENV, raising=False)
    monkeypatch.delenv(HEARTBEAT_INTERVAL_ENV, raising=False)


@pytest.fixture
def slow_beat(tmp_path: Path) -> Iterator[Heartbeat]:
    """Started, with a period long enough that only start/stop write during a test."""
    hb = Heartbeat(rank=3, local_rank=1, host="node-a", period=60)
    hb.start(tmp_path)
    yield hb
    hb.stop()


def test_start_writes_every_field_at_once(slow_beat: Heartbeat, tmp_path: Path) -> None:
    data = read(tmp_path / "heartbeat" / "rank-3.json")
    assert set(data) == FIELDS
    assert (data["rank"], data["local_rank"], data["pid"], data["host"]) == (
        3, 1, os.getpid(), "node-a",
    )  # fmt: skip
    assert (data["step"], data["total_steps"], data["epoch"], data["phase"]) == (0, 0, 0, "start")
    assert (data["loss"], data["images_per_sec"]) == (None, None)
    assert abs(data["time"] - time.time()) < 60
    assert [p.name for p in (tmp_path / "heartbeat").iterdir()] == ["rank-3.json"]  # no temp


def test_marks_do_no_io_and_stop_writes_them_with_phase_done(
    slow_beat: Heartbeat, tmp_path: Path
) -> None:
    path = tmp_path / "heartbeat" / "rank-3.json"
    first = path.read_text()
    before = time.time()
    slow_beat.set_total(50)
    slow_beat.progress(step=5, phase="train", epoch=2)
    slow_beat.interval(1.25, 300.0)
    assert path.read_text() == first  # nothing written from the caller's thread
    slow_beat.stop()
    data = read(path)
    assert (data["step"], data["total_steps"], data["epoch"], data["phase"]) == (5, 50, 2, "done")
    assert (data["loss"], data["images_per_sec"]) == (1.25, 300.0)
    assert data["progress_time"] >= before


def test_interval_sets_sec_per_image_and_none_clears_it() -> None:
    """An interval without images has no figure: the last one must not stand for it."""
    hb = Heartbeat(rank=0, local_rank=0, host="node-a", period=60)
    assert "sec_per_image" not in hb.snapshot()
    hb.interval(1.0, 100.0, 50.0, 0.0123)
    assert (hb.snapshot()["sec_per_image"], hb.snapshot()["rank_images_per_sec"]) == (0.0123, 50.0)
    hb.interval(1.0, 100.0, 0.0, None)
    assert hb.snapshot()["sec_per_image"] is None


def test_nothing_is_written_before_start(tmp_path: Path) -> None:
    hb = Heartbeat(rank=0, local_rank=0, host="h", period=0.01)
    hb.progress(step=1, phase="train")
    hb.stop()  # never started: no final record either
    time.sleep(0.05)
    assert list(tmp_path.iterdir()) == []


def test_thread_keeps_time_fresh_while_progress_time_stands_still(tmp_path: Path) -> None:
    """A rank waiting in a collective: alive (time moves), not progressing."""
    hb = Heartbeat(rank=0, local_rank=0, host="h", period=0.05)
    hb.start(tmp_path)
    try:
        hb.progress(step=7, phase="train")
        time.sleep(0.3)
        first = read(tmp_path / "heartbeat" / "rank-0.json")
        time.sleep(0.3)
        second = read(tmp_path / "heartbeat" / "rank-0.json")
    finally:
        hb.stop()
    assert first["step"] == 7
    assert second["time"] - first["time"] >= 0.1
    assert time.time() - second["time"] < 0.5
    assert second["progress_time"] == first["progress_time"]


def test_the_agents_directory_and_period_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(tmp_path / "local"))
    monkeypatch.setenv(HEARTBEAT_INTERVAL_ENV, "0.25")
    hb = Heartbeat(rank=1, local_rank=1, host="h")
    hb.start()  # no output directory known yet: the agent's is enough
    hb.start(tmp_path / "out")  # a second start changes nothing
    hb.stop()
    assert hb.period == 0.25
    assert read(tmp_path / "local" / "rank-1.json")["phase"] == "done"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["", "0", "-1", "soon"])
def test_an_unusable_period_falls_back_to_one_second(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HEARTBEAT_INTERVAL_ENV, value)
    assert Heartbeat(rank=0, local_rank=0, host="h").period == 1.0


def test_without_the_agent_start_needs_the_output_dir(tmp_path: Path) -> None:
    hb = Heartbeat(rank=0, local_rank=0, host="h")
    hb.start()
    assert hb.period == 1.0
    assert hb.path is None
    hb.start(tmp_path)
    hb.stop()
    assert read(tmp_path / "heartbeat" / "rank-0.json")["phase"] == "done"


def test_a_failed_write_is_logged_once_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk must not kill training: one warning, however many writes fail.

    pytest also captures the "trainer" logger when an earlier in-process setup_logging
    stopped it propagating; turning propagation back on here would count each record twice.
    """
    blocked = tmp_path / "out"
    blocked.write_text("")  # a file where the output directory should be
    hb = Heartbeat(rank=0, local_rank=0, host="h", period=0.01)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        hb.start(blocked)
        time.sleep(0.1)  # the thread's writes fail too
        hb.progress(step=1, phase="train")
        hb.stop()
    path = blocked / "heartbeat" / "rank-0.json"
    assert [(r.levelno, r.getMessage().split(": ")[0]) for r in caplog.records] == [
        (logging.WARNING, f"heartbeat {path} not written")
    ]


FROZEN_CHILD = """
import sys, time
from pathlib import Path
from trainer.metrics import Heartbeat
hb = Heartbeat(rank=0, local_rank=0, host="h", period=0.05)
hb.start(Path(sys.argv[1]))
print("started", flush=True)
time.sleep(60)
"""


def test_a_stopped_process_stops_beating(tmp_path: Path) -> None:
    """SIGSTOP freezes the thread too: ``time`` goes stale (how the agent tells frozen)."""
    child = subprocess.Popen(
        [sys.executable, "-c", FROZEN_CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    path = tmp_path / "heartbeat" / "rank-0.json"
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "started\n"
        child.send_signal(signal.SIGSTOP)
        time.sleep(0.2)  # a write under way finishes (or not) before we look
        frozen = read(path)["time"]
        time.sleep(0.5)
        assert read(path)["time"] == frozen
        child.send_signal(signal.SIGCONT)
        time.sleep(0.3)
        assert read(path)["time"] > frozen
    finally:
        child.kill()
        child.wait()
