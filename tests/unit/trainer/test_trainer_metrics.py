from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_clock import Clock

from trainer.metrics import MetricsLog, Throughput


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
