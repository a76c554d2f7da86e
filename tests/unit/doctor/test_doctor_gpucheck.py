"""ddpfleet_doctor.gpucheck: its logic runs on CPU processes with gloo; its CUDA side fails
cleanly."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest
import torch
from time_bounds import within

from ddpfleet_doctor import gpucheck, gpuplan


def test_all_reduce_across_two_gloo_ranks_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code = gpucheck.main(["--host", "h1", "--gpus", "2", "--device", "cpu", "--backend", "gloo"])
    assert code == 0
    assert capsys.readouterr().out == "gpucheck ok on h1: gloo all-reduce across 2 ranks\n"


def test_no_cuda_is_one_line_naming_the_host(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.fail("this test expects a machine without CUDA")
    assert gpucheck.main(["--host", "gpu7", "--gpus", "1"]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert out.startswith("gpucheck failed on gpu7: CUDA cannot start: Found no NVIDIA driver")


def test_a_rank_that_fails_is_named() -> None:
    problems = gpucheck.check(1, "nccl", "cpu", (7, 5))  # nccl cannot run on CPU tensors
    assert len(problems) == 1
    assert problems[0].startswith("cpu:0: ")


@pytest.mark.parametrize(
    ("caps", "problems"),
    [
        (["9.0", "9.0"], []),
        (["7.5"], []),
        (["8.0", "7.0"], ["GPU 1 (gpu) has compute capability 7.0, below 7.5"]),
        (["6.1"], ["GPU 0 (gpu) has compute capability 6.1, below 7.5"]),
        (["x"], ["GPU 0 (gpu) has compute capability x, below 7.5"]),
    ],
)
def test_compute_capability_floor(caps, problems) -> None:
    """The floor gpucheck applies in the image is the preflight's (ddpfleet_doctor.gpuplan)."""
    assert gpuplan.capability_problems([("gpu", c) for c in caps], "7.5") == problems


def test_a_wrong_sum_is_reported() -> None:
    assert gpucheck.sum_problem(torch.full((4,), 3.0), 2) is None
    assert gpucheck.sum_problem(torch.tensor([3.0, 2.0]), 2) == (
        "all-reduce returned 2.0..3.0, expected 3.0"
    )


def test_bad_arguments_exit_2() -> None:
    assert gpucheck.main(["--gpus", "0"]) == 2
    assert gpucheck.main(["--gpus", "1", "--min-capability", "seven"]) == 2


@pytest.mark.parametrize(
    ("message", "line"),
    [
        (
            "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
            "calling NumCudaDevices() that might have already set an error? Error 802: system "
            "not yet initialized",
            "CUDA cannot start: Error 802: system not yet initialized (on an NVSwitch board "
            "(HGX/DGX) nvidia-fabricmanager is not running, or its version differs from the "
            "driver's)",
        ),
        (
            "Unexpected error from cudaGetDeviceCount(). Error 804: forward compatibility was "
            "attempted on non supported HW",
            "CUDA cannot start: Error 804: forward compatibility was attempted on non supported "
            "HW (the image's CUDA forward-compatibility libraries do not support this GPU: "
            "upgrade the host's driver)",
        ),
        (
            "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU "
            "and installed a driver from http://www.nvidia.com/Download/index.aspx",
            "CUDA cannot start: Found no NVIDIA driver on your system (the container got no GPU "
            "(NVIDIA runtime or device request missing) or the host's driver is not loaded)",
        ),
        ("CUDA error: unknown error", "CUDA cannot start: CUDA error: unknown error"),
    ],
)
def test_cuda_start_up_errors_are_one_line_with_their_usual_cause(message, line) -> None:
    assert gpucheck.cuda_start_problem(RuntimeError(message)) == line


def _rank_processes(started: float, timeout: float = 60.0) -> list[mp.Process]:
    """gpucheck's rank processes in rank order, once both have started (the Manager is a child
    too). They are made in rank order, and a process's name counts the children made."""
    while time.monotonic() - started < timeout:
        ranks = [p for p in mp.active_children() if p.name.startswith("SpawnProcess-")]
        if len(ranks) == 2:
            return sorted(ranks, key=lambda p: int(p.name.rsplit("-", 1)[1]))
        time.sleep(0.01)
    pytest.fail("gpucheck's ranks did not start")


def _check_with_a_fault(rank: int, signum: int, timeout: float) -> tuple[list[str], float]:
    """Run a 2-rank gloo check, send ``signum`` to ``rank`` as soon as it has started; return
    the problems and the seconds the check took, once no rank process is left."""
    result: list[list[str]] = []
    started = time.monotonic()
    thread = threading.Thread(
        target=lambda: result.append(gpucheck.check(2, "gloo", "cpu", (7, 5), timeout))
    )
    thread.start()
    ranks = _rank_processes(started)
    os.kill(ranks[rank].pid, signum)
    thread.join(timeout=timeout + 45)
    assert not thread.is_alive()
    assert not any(p.is_alive() for p in ranks)
    return result[0], time.monotonic() - started


def test_a_frozen_rank_is_reported_as_a_hang_and_ended() -> None:
    """SIGSTOP one rank while it starts: its peer waits for it forever; gpucheck ends both at
    its deadline and says the all-reduce hung, naming the ranks that never reported."""
    (problem,), took = _check_with_a_fault(1, signal.SIGSTOP, timeout=15)
    assert problem.startswith("cpu:0, 1 did not finish within 15 s, a hang: ")
    assert 15 <= took < within(40)


def test_a_killed_rank_is_named_with_its_signal_and_its_peer_ended() -> None:
    problems, took = _check_with_a_fault(0, signal.SIGKILL, timeout=60)
    assert problems == ["cpu:0: the rank died (signal SIGKILL)"]
    assert took < min(within(30), 50)  # not the 60 s deadline: its peer was ended at once
