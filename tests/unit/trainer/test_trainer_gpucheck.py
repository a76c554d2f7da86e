"""trainer.gpucheck: its logic runs on CPU processes with gloo; its CUDA side fails cleanly."""

from __future__ import annotations

import pytest
import torch

from trainer import gpucheck


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
    assert out.startswith("gpucheck failed on gpu7: CUDA is not available")


def test_a_rank_that_fails_is_named() -> None:
    problems = gpucheck.check(1, "nccl", "cpu", (7, 5))  # nccl cannot run on CPU tensors
    assert len(problems) == 1
    assert problems[0].startswith("cpu:0: ")


@pytest.mark.parametrize(
    ("caps", "problems"),
    [
        ([(9, 0), (9, 0)], []),
        ([(7, 5)], []),
        ([(8, 0), (7, 0)], ["GPU 1 has compute capability 7.0, below 7.5"]),
        ([(6, 1)], ["GPU 0 has compute capability 6.1, below 7.5"]),
    ],
)
def test_compute_capability_floor(caps, problems) -> None:
    assert gpucheck.capability_problems(caps, (7, 5)) == problems


def test_a_wrong_sum_is_reported() -> None:
    assert gpucheck.sum_problem(torch.full((4,), 3.0), 2) is None
    assert gpucheck.sum_problem(torch.tensor([3.0, 2.0]), 2) == (
        "all-reduce returned 2.0..3.0, expected 3.0"
    )


def test_bad_arguments_exit_2() -> None:
    assert gpucheck.main(["--gpus", "0"]) == 2
    assert gpucheck.main(["--gpus", "1", "--min-capability", "seven"]) == 2
