"""The compute check's start line (ddpfleet_doctor.startline) with real sockets and threads:
the processes start timing together once the last is warmed up; a missing one holds the others
only until the line's timeout; one that comes late or finds no line times on its own and says
so; the CLI refuses a malformed line."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from time_bounds import within

from ddpfleet_doctor import cli, compute, startline


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_later(port: int, count: int, delay: float, out: dict, key: str, **kw) -> threading.Thread:
    """Reach the line ``delay`` seconds from now; ``out[key]`` = (arrived, left, figures)."""

    def go() -> None:
        time.sleep(delay)
        arrived = time.monotonic()
        figures = startline.wait("127.0.0.1", port, count, **kw)
        out[key] = (arrived, time.monotonic(), figures)

    thread = threading.Thread(target=go)
    thread.start()
    return thread


@pytest.mark.wallclock
def test_every_process_starts_when_the_last_one_is_warmed_up():
    port, out = free_port(), {}
    startline.serve(port, 3, timeout=30)
    threads = [wait_later(port, 3, d, out, str(d), timeout=30) for d in (0.0, 0.3, 0.6)]
    for t in threads:
        t.join(timeout=within(10))
    last = max(arrived for arrived, _, _ in out.values())
    left = [left for _, left, _ in out.values()]
    assert min(left) >= last  # nobody went before the last one was there
    assert max(left) - min(left) < within(0.5), left  # and then all at once
    assert all(
        f == {"together": 3, "of": 3, "waited_sec": f["waited_sec"]} for *_, f in out.values()
    )
    assert out["0.0"][2]["waited_sec"] >= 0.5


@pytest.mark.wallclock
def test_a_missing_process_holds_the_others_only_until_the_timeout_and_a_late_one_goes_at_once():
    port, out = free_port(), {}
    line = startline.serve(port, 3, timeout=0.5)
    threads = [wait_later(port, 3, 0.0, out, k, timeout=0.5) for k in ("a", "b")]
    for t in threads:
        t.join(timeout=within(10))
    assert line.opened.wait(within(2))
    for _, _, figures in out.values():
        assert figures["together"] == 2
        assert figures["of"] == 3
        assert "error" not in figures
        assert 0.3 < figures["waited_sec"] < within(2), figures
    late = startline.wait("127.0.0.1", port, 3, timeout=30)
    assert late["together"] == 1
    assert late["error"] == "came after the others had started"
    assert late["waited_sec"] < within(1), late


@pytest.mark.wallclock
def test_a_process_that_finds_no_line_times_on_its_own_after_the_timeout():
    figures = startline.wait("127.0.0.1", free_port(), 3, timeout=0.2)
    assert figures["together"] == 1
    assert figures["of"] == 3
    assert "ConnectionRefusedError" in figures["error"], figures
    assert 5.2 <= figures["waited_sec"] < within(8)  # the line's timeout, and 5 s of start-up


def test_time_steps_waits_at_the_line_between_warm_up_and_timing():
    calls = []
    timed = compute.time_steps(
        lambda: calls.append("step"),
        warmup=2,
        seconds=0.0,
        max_steps=3,
        at_start=lambda: calls.append("line") or {"together": 2, "of": 2},
    )
    assert calls == ["step", "line", "step", "step"]  # warm-up stops at half of 0 s
    assert timed["start_line"] == {"together": 2, "of": 2}
    assert "start_line" not in compute.time_steps(lambda: None, 1, 0.0, 2)


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [("10.0.0.1:29601:3", ("10.0.0.1", 29601, 3)), ("node1:1:1", ("node1", 1, 1))],
)
def test_a_line_is_address_port_and_count(spec, parsed):
    assert startline.parse(spec) == parsed


@pytest.mark.parametrize(
    "spec", ["10.0.0.1:29601", ":29601:3", "h:0:3", "h:70000:3", "h:1:0", "h:x:3"]
)
def test_a_malformed_line_is_refused_in_one_line(spec, capsys):
    assert cli.main(["compute", f"--start-line={spec}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--start-line must be ADDRESS:PORT:COUNT" in err
