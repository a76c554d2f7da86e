"""The choices that differ on CUDA, taken as pure functions of what the device reports."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.config import TrainConfig, default_batch_size, parse_config
from trainer.model import build_optimizer, choose_amp, warmup_epochs, wrap_ddp


@pytest.mark.parametrize(
    ("requested", "device", "capability", "cpu_bf16", "chosen"),
    [
        ("auto", "cuda", (7, 5), False, "fp16"),  # Turing: bf16 would be emulated
        ("auto", "cuda", (8, 0), False, "bf16"),  # A100
        ("auto", "cuda", (8, 6), False, "bf16"),
        ("auto", "cuda", (9, 0), False, "bf16"),  # H100
        ("fp16", "cuda", (9, 0), False, "fp16"),
        ("off", "cuda", (9, 0), False, "off"),
        ("bf16", "cuda", (8, 9), False, "bf16"),
        ("auto", "cpu", None, True, "bf16"),
        ("auto", "cpu", None, False, "off"),
    ],
)
def test_amp_choice_follows_the_rank_s_own_device(requested, device, capability, cpu_bf16, chosen):
    assert choose_amp(requested, device, capability, cpu_bf16) == chosen


@pytest.mark.parametrize(("device", "capability"), [("cuda", (7, 5)), ("cpu", None)])
def test_bf16_asked_of_a_device_without_it_is_refused(device, capability) -> None:
    with pytest.raises(ValueError, match="--amp bf16: no native bf16"):
        choose_amp("bf16", device, capability, False)


@pytest.mark.parametrize(
    ("given", "device", "used"), [(0, "cuda", 256), (0, "cpu", 32), (64, "cuda", 64), (8, "cpu", 8)]
)
def test_batch_size_zero_means_the_device_s_default(given, device, used) -> None:
    assert default_batch_size(given, device) == used


def test_the_trainer_s_default_batch_size_is_auto() -> None:
    assert parse_config(["--synthetic"]).batch_size == 0


@pytest.mark.parametrize(
    ("requested", "global_batch", "epochs"),
    [(1.0, 256, 1.0), (1.0, 2048, 1.25), (1.0, 8192, 5.0), (1.0, 16384, 10.0), (0.0, 256, 0.15625)],
)
def test_warmup_grows_with_the_global_batch(requested, global_batch, epochs) -> None:
    assert warmup_epochs(requested, global_batch) == pytest.approx(epochs)


def test_sgd_is_not_fused_on_the_cpu() -> None:
    opt = build_optimizer(torch.nn.Linear(2, 2), TrainConfig(), 0.1)
    assert not opt.defaults["fused"]
    assert opt.defaults["nesterov"]


def test_ddp_does_not_broadcast_buffers_every_step(tmp_path: Path) -> None:
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        wrapped = wrap_ddp(torch.nn.BatchNorm1d(2), torch.device("cpu"), 2)
        assert wrapped.forward_sync_buffers is False
    finally:
        torch.distributed.destroy_process_group()
