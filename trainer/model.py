"""Model, optimizer, LR schedule and mixed-precision choice."""

from __future__ import annotations

import contextlib
import inspect
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


# torch >= 2.14 renamed broadcast_buffers=False (it warns) to forward_sync_buffers=False.
_NO_FORWARD_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)


def wrap_ddp(
    model: nn.Module, device: torch.device, world_size: int, *, static: bool = True
) -> nn.Module:
    """DDP with gradients as bucket views and a static graph (``static``: not with gradient
    accumulation, whose ``no_sync`` backward passes a static graph's reducer refuses).

    A world of one is left unwrapped: there is nothing to all-reduce, and DDP's bucketing
    would still cost ~10% of a CPU step (measured: 23.6 vs 21.2 img/s, bench/README.md).
    No buffer sync per step (``broadcast_buffers=False``): DDP would otherwise broadcast every
    BatchNorm buffer from rank 0 before each forward; the ranks' running statistics are synced
    once, before validation (``distributed.sync_buffers``), the only place they are read.
    """
    if world_size == 1:
        return model
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        static_graph=static,
        **_NO_FORWARD_BUFFER_SYNC,
    )


def build_optimizer(model: nn.Module, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum; no weight decay on BatchNorm parameters and biases.

    On CUDA the fused kernel (one launch for every parameter instead of a loop of small ones)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = bool(decay) and all(p.is_cuda for p in decay + no_decay)
    return torch.optim.SGD(
        groups, lr=lr, momentum=cfg.momentum, nesterov=True, **({"fused": True} if fused else {})
    )


def scaled_lr(base_lr: float, global_batch: int) -> float:
    """Linear scaling rule: ``base_lr`` is for a global batch of 256."""
    return base_lr * global_batch / 256


GOYAL_WARMUP_EPOCHS, GOYAL_GLOBAL_BATCH = 5.0, 8192


def warmup_epochs(requested: float, global_batch: int) -> float:
    """Warmup grows with the global batch: at least ``requested`` epochs, and 5 epochs per
    8,192 images of global batch (Goyal et al. 2017, linear scaling with 5 warmup epochs at 8k):
    2,048 -> 1.25, 8,192 -> 5, 16,384 -> 10 (the schedule caps it at a quarter of the run)."""
    return max(requested, GOYAL_WARMUP_EPOCHS * global_batch / GOYAL_GLOBAL_BATCH)


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


def choose_amp(
    requested: str, device_type: str, capability: tuple[int, int] | None, cpu_bf16: bool = False
) -> str:
    """The autocast dtype ('bf16', 'fp16' or 'off') for ``--amp requested``.

    CUDA: bf16 only on compute capability >= 8.0 (Ampere and later run it natively; older
    cards emulate it slowly, and ``torch.cuda.is_bf16_supported()`` counts emulation), else
    fp16 with the gradient scaler. CPU: bf16 where oneDNN has native bf16, else off.
    ValueError for bf16 asked of a device without it."""
    if requested in ("off", "fp16"):
        return requested
    if device_type == "cuda":
        native = capability is not None and tuple(capability) >= (8, 0)
    else:
        native = cpu_bf16
    if requested == "bf16" and not native:
        where = f"compute capability {capability[0]}.{capability[1]}" if capability else device_type
        raise ValueError(f"--amp bf16: no native bf16 on {where}")
    if native:
        return "bf16"
    return "fp16" if device_type == "cuda" else "off"


def resolve_amp(mode: str, device: torch.device) -> torch.dtype | None:
    """choose_amp for this rank's own device (its index, not device 0)."""
    capability, cpu_bf16 = None, False
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
    elif torch.backends.mkldnn.is_available():
        cpu_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    try:
        name = choose_amp(mode, device.type, capability, cpu_bf16)
    except ValueError as exc:
        raise BadInputError(str(exc)) from None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}[name]


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(device: torch.device, dtype: torch.dtype | None) -> torch.amp.GradScaler:
    """Enabled only for fp16 (bf16 has fp32's exponent range and needs no scaling)."""
    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
