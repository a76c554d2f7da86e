from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

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
    meter = Throughput(warmup=2)
    meter.step(100)
    time.sleep(0.2)  # a slow first step must not count
    meter.step(100)
    for _ in range(3):
        time.sleep(0.01)
        meter.step(10)
    assert meter.overall() > 300  # 30 images in ~0.03 s, not 230 in ~0.23 s


def test_throughput_leaves_out_paused_time() -> None:
    meter = Throughput(warmup=1)
    meter.step(100)  # warm-up: the timed part starts here
    time.sleep(0.02)
    meter.step(100)
    with meter.paused():  # validation between epochs
        time.sleep(0.3)
    time.sleep(0.02)
    meter.step(100)
    assert meter.overall() > 2000  # 200 images in ~0.04 s, not in ~0.34 s (~590 img/s)
    assert meter.interval() > 2000


def test_a_pause_after_the_last_step_leaves_the_rate_as_it_was() -> None:
    meter = Throughput(warmup=1)
    meter.step(100)
    time.sleep(0.05)
    meter.step(100)  # 100 images in ~0.05 s
    before = meter.overall()
    with meter.paused():  # the last validation, after the last step
        time.sleep(0.1)
    assert meter.overall() == before
    assert 500 < before < 2100


@pytest.mark.wallclock  # sleeps, and asserts their share of the interval's wall time
def test_data_wait_fraction_is_the_interval_s_share_of_waiting() -> None:
    meter = Throughput(warmup=0)
    meter.interval()  # start an interval
    time.sleep(0.1)
    meter.waited(0.05)  # half of it waiting for the loader
    meter.step(10)
    meter.interval()
    assert 0.3 < meter.wait_fraction < 0.55
    time.sleep(0.02)
    meter.interval()  # the next interval starts from nothing
    assert meter.wait_fraction == 0.0
