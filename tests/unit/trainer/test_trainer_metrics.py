from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
from fake_clock import Clock

from trainer import metrics
from trainer.metrics import ForwardTimer, MetricsLog, Throughput


def test_resumed_metrics_drop_rows_after_the_checkpoint(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl", resume_step=None)
    for step in (1, 2, 3, 4):
        log.write({"step": step})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "lo')  # torn by a crash
    MetricsLog(tmp_path / "metrics.jsonl", resume_step=2)
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1}, {"step": 2}]


def test_throughput_leaves_out_warmup_steps() -> None:
    clock = Clock()
    meter = Throughput(warmup=2, clock=clock.monotonic)
    meter.step(100)
    clock.sleep(0.2)  # a slow first step must not count
    meter.step(100)
    for _ in range(3):
        clock.sleep(0.01)
        meter.step(10)
    assert meter.overall() == pytest.approx(1000)  # 30 images in 0.03 s, not 230 in 0.23 s


def test_throughput_leaves_out_paused_time() -> None:
    clock = Clock()
    meter = Throughput(warmup=1, clock=clock.monotonic)
    meter.step(100)  # warm-up: the timed part starts here
    clock.sleep(0.02)
    meter.step(100)
    with meter.paused():  # validation between epochs
        clock.sleep(0.3)
    clock.sleep(0.02)
    meter.step(100)
    assert meter.overall() == pytest.approx(5000)  # 200 images in 0.04 s, not in 0.34 s
    assert meter.interval() == pytest.approx(7500)  # 300 images in 0.04 s


def test_a_pause_after_the_last_step_leaves_the_rate_as_it_was() -> None:
    clock = Clock()
    meter = Throughput(warmup=1, clock=clock.monotonic)
    meter.step(100)
    clock.sleep(0.05)
    meter.step(100)  # 100 images in 0.05 s
    before = meter.overall()
    with meter.paused():  # the last validation, after the last step
        clock.sleep(0.1)
    assert meter.overall() == before == pytest.approx(2000)


def test_data_wait_fraction_is_the_interval_s_share_of_waiting() -> None:
    clock = Clock()
    meter = Throughput(warmup=0, clock=clock.monotonic)
    meter.interval()  # start an interval
    clock.sleep(0.1)
    meter.waited(0.05)  # half of it waiting for the loader
    meter.step(10)
    meter.interval()
    assert meter.wait_fraction == pytest.approx(0.5)
    clock.sleep(0.02)
    meter.interval()  # the next interval starts from nothing
    assert meter.wait_fraction == 0.0


def _closed_interval(waits: list[float], images: list[int]) -> Throughput:
    """A meter whose last interval waited ``waits`` for data over steps of ``images``."""
    clock = Clock()
    meter = Throughput(warmup=0, clock=clock.monotonic)
    for wait, count in zip(waits, images, strict=True):
        meter.waited(wait)
        clock.sleep(1.0)  # the wall time (peers' waits included) is no part of the rule
        meter.step(count)
    meter.interval()
    return meter


@pytest.mark.parametrize(
    ("waits", "images", "forward", "expected"),
    [
        ([0.0], [10], 0.02, 0.006),  # 3 x 0.02 s over 10 images
        ([0.05, 0.03], [10, 6], 0.1, 0.02375),  # (0.08 + 0.3) / 16
        ([0.4], [4], 0.0, 0.1),  # waiting for data only
        ([0.0, 0.0, 0.0], [1, 1, 1], 1 / 3, 1 / 3),  # rounded to 6 significant digits
    ],
)
def test_sec_per_image_is_data_wait_plus_three_forwards_over_images(
    waits: list[float], images: list[int], forward: float, expected: float
) -> None:
    got = _closed_interval(waits, images).sec_per_image(forward)
    assert got == pytest.approx(expected, rel=1e-5)
    assert got == float(f"{got:.6g}")


def test_sec_per_image_without_images_is_none() -> None:
    assert _closed_interval([0.5], [0]).sec_per_image(0.2) is None


def test_sec_per_image_is_the_last_interval_s_only() -> None:
    meter = _closed_interval([0.5], [10])
    meter.step(5)  # the next interval, still open: no wait
    assert meter.sec_per_image(0.0) == pytest.approx(0.05)
    meter.interval()
    assert meter.sec_per_image(0.1) == pytest.approx(0.06)  # 3 x 0.1 over 5, no wait


def test_the_forward_timer_counts_the_time_inside_and_resets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(metrics, "time", types.SimpleNamespace(perf_counter=clock.monotonic))
    timer = ForwardTimer()
    with timer.timed(torch.device("cpu")):
        clock.sleep(0.02)
    clock.sleep(0.5)  # outside: not counted
    with timer.timed(torch.device("cpu")):
        clock.sleep(0.03)
    assert timer.seconds() == pytest.approx(0.05)
    assert timer.seconds() == 0.0


class _FakeEvent:
    """torch.cuda.Event's timing surface: ``record`` stamps the fake clock's time."""

    def __init__(self, clock: Clock, synced: list[_FakeEvent]) -> None:
        self.clock, self.synced, self.at = clock, synced, None

    def record(self, stream: object) -> None:
        self.at = self.clock.now

    def synchronize(self) -> None:
        self.synced.append(self)

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.at - self.at) * 1000  # milliseconds, as CUDA's


def test_on_cuda_the_forward_timer_reads_event_pairs_and_waits_for_the_last_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, synced = Clock(), []
    fake_cuda = types.SimpleNamespace(
        Event=lambda enable_timing: _FakeEvent(clock, synced),
        current_stream=lambda device: "stream",
    )
    monkeypatch.setattr(metrics.torch, "cuda", fake_cuda)
    timer = ForwardTimer()
    for spent in (0.02, 0.03):
        with timer.timed(torch.device("cuda", 0)):
            clock.sleep(spent)
        clock.sleep(1.0)  # the backward: not counted
    assert synced == []  # no sync per step
    last = timer.events[-1][1]
    assert timer.seconds() == pytest.approx(0.05)
    assert synced == [last]
    assert (timer.seconds(), timer.events) == (0.0, [])
