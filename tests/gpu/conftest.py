"""GPU tier (``make test-gpu``): the trainer's CUDA paths, on a host with an NVIDIA GPU.

Not part of ``make test`` (CI has no GPU). Without a CUDA device the tier stops with one
line instead of skipping: a GPU check that passes by skipping would say nothing."""

from __future__ import annotations

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    if not torch.cuda.is_available():
        pytest.exit("tests/gpu needs a CUDA device (torch.cuda.is_available() is False)", 2)
