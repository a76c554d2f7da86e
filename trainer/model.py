"""Model, optimizer, LR schedule and mixed-precision choice."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torchvision
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.config import BadInputError, TrainConfig


def build_model(arch: str, num_classes: int) -> nn.Module:
    """A torchvision classifier; ResNets get zero-initialised last BN per block (Goyal)."""
    if arch not in torchvision.models.list_models(module=torchvision.models):
        raise BadInputError(f"--arch {arch}: not a torchvision classification model")
    kwargs: dict[str, object] = {"num_classes": num_classes}
    if arch.startswith(("resnet", "resnext", "wide_resnet")):
        kwargs["zero_init_residual"] = True
    return torchvision.models.get_model(arch, weights=None, **kwargs)


def wrap_ddp(model: nn.Module, device: torch.device, world_size: int) -> nn.Module:
    """DDP with gradients as bucket views and a static graph.

    A world of one is left unwrapped: there is nothing to all-reduce, and DDP's bucketing
    would still cost ~10% of a CPU step (measured: 23.6 vs 21.2 img/s, bench/README.md).
    """
    if world_size == 1:
        return model
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        static_graph=True,
    )


def build_optimizer(model: nn.Module, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum; no weight decay on BatchNorm parameters and biases."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=True)


def scaled_lr(base_lr: float, global_batch: int) -> float:
    """Linear scaling rule: ``base_lr`` is for a global batch of 256."""
    return base_lr * global_batch / 256


def lr_factor(total_steps: int, warmup_steps: int, decay: str) -> Callable[[int], float]:
    """Multiplier of the peak LR at a step: linear warmup, then cosine or step decay."""
    warmup = min(warmup_steps, total_steps // 4)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        if decay == "step":
            return 0.1 ** sum(progress >= m for m in (0.3, 0.6, 0.8))
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, decay: str
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(total_steps, warmup_steps, decay))


def _bf16_ok(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def resolve_amp(mode: str, device: torch.device) -> torch.dtype | None:
    """auto: bf16 where supported (CPU included), else fp16 on CUDA, else off."""
    if mode == "off":
        return None
    if mode == "bf16":
        if not _bf16_ok(device):
            raise BadInputError(f"--amp bf16: not supported on {device.type}")
        return torch.bfloat16
    if mode == "fp16":
        return torch.float16
    if _bf16_ok(device):
        return torch.bfloat16
    return torch.float16 if device.type == "cuda" else None


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(device: torch.device, dtype: torch.dtype | None) -> torch.amp.GradScaler:
    """Enabled only for fp16 (bf16 has fp32's exponent range and needs no scaling)."""
    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
