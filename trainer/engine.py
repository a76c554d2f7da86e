"""The training step loop, validation, and the ranks' agreement to stop."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer import distributed as dist_utils
from trainer.config import TrainConfig
from trainer.data import to_device
from trainer.metrics import LOG, Heartbeat, MetricsLog, Throughput
from trainer.model import autocast
from trainer.stop import StopFlag


@dataclasses.dataclass
class Run:
    """Everything the loop touches; ``step`` counts optimizer steps since the first run."""

    cfg: TrainConfig
    env: dist_utils.DistEnv
    model: nn.Module  # DDP-wrapped and possibly compiled
    raw_model: nn.Module  # what checkpoints store
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    criterion: nn.Module
    amp_dtype: torch.dtype | None
    norm: torch.Tensor
    heartbeat: Heartbeat
    metrics: MetricsLog | None
    meter: Throughput
    stop: StopFlag
    total_steps: int
    steps_per_epoch: int
    step: int = 0
    epoch: int = 0
    last_loss: float | None = None


def _log_interval(run: Run, loss_sum: torch.Tensor, count: int) -> None:
    """All-reduce the interval's loss and throughput; rank 0 writes a metrics row."""
    rate = run.meter.interval()
    total_loss, total_count, total_rate = dist_utils.all_reduce_sum(
        run.env, [float(loss_sum.item()), float(count), rate]
    )
    run.last_loss = total_loss / max(total_count, 1.0)
    lr = run.optimizer.param_groups[0]["lr"]
    row = {
        "step": run.step,
        "epoch": run.epoch,
        "loss": round(run.last_loss, 6),
        "lr": lr,
        "images_per_sec": round(total_rate, 2),
    }
    if run.metrics is not None:
        run.metrics.write(row)
        LOG.info(
            "step %d/%d epoch %d loss %.4f lr %.5f %.1f img/s",
            run.step,
            run.total_steps,
            run.epoch,
            run.last_loss,
            lr,
            total_rate,
        )


def stop_agreed(run: Run) -> bool:
    """Collective: True on every rank when any rank got a stop signal."""
    run.stop.agreed = dist_utils.agree_max(run.env, run.stop.signum)
    return bool(run.stop.agreed)


def train_one_epoch(
    run: Run, loader: DataLoader, on_checkpoint: Callable[[int], None]
) -> tuple[bool, int]:
    """Train until the epoch, the step budget or a stop signal ends it.

    Returns (stopped, batches done). Every rank agrees on stopping after each step
    (a CPU all-reduce of the signal number), so all ranks leave at the same step.
    """
    cfg, env = run.cfg, run.env
    run.model.train()
    loss_sum = torch.zeros((), device=env.device)
    count = batches = 0
    for images, labels in loader:
        x = to_device(images, env.device, cfg.channels_last, run.norm)
        y = labels.to(env.device, non_blocking=True)
        with autocast(env.device, run.amp_dtype):
            loss = run.criterion(run.model(x), y)
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(loss).backward()
        run.scaler.step(run.optimizer)
        run.scaler.update()
        run.scheduler.step()
        run.step += 1
        batches += 1
        loss_sum += loss.detach().float()
        count += 1
        done = run.step >= run.total_steps
        if done and env.device.type == "cuda":
            torch.cuda.synchronize(env.device)  # the last step's time includes its GPU work
        run.meter.step(len(labels))
        run.heartbeat.beat(run.step)
        if run.step % cfg.log_every == 0 or done:
            _log_interval(run, loss_sum, count)
            loss_sum.zero_()
            count = 0
        if stop_agreed(run):
            if count:  # so that the summary's final_loss covers the last steps
                _log_interval(run, loss_sum, count)
            return True, batches
        if cfg.checkpoint_every and run.step % cfg.checkpoint_every == 0 and not done:
            on_checkpoint(batches)
        if done:
            break
    if count:
        _log_interval(run, loss_sum, count)
    return False, batches


@torch.no_grad()
def evaluate(run: Run, loader: DataLoader) -> float:
    """Top-1 accuracy over the whole split, summed over ranks (padded samples included)."""
    model = run.raw_model
    dist_utils.sync_buffers(run.env, model)
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=run.env.device)
    total = 0
    for images, labels in loader:
        x = to_device(images, run.env.device, run.cfg.channels_last, run.norm)
        y = labels.to(run.env.device, non_blocking=True)
        with autocast(run.env.device, run.amp_dtype):
            logits = model(x)
        correct += (logits.argmax(dim=1) == y).sum()
        total += len(labels)
    c, t = dist_utils.all_reduce_sum(run.env, [float(correct.item()), float(total)])
    model.train()
    return c / max(t, 1.0)
