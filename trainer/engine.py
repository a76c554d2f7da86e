"""The training loop: steps, epochs, validation, and the ranks' agreement to stop."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer import distributed as dist_utils
from trainer.balance import forward_backward
from trainer.config import TrainConfig
from trainer.inputs import InputPipeline
from trainer.metrics import LOG, ForwardTimer, Heartbeat, MetricsLog, NonFiniteError, Throughput
from trainer.model import autocast
from trainer.stop import StopFlag
from trainer.tboard import EventLog


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
    heartbeat: Heartbeat
    metrics: MetricsLog | None
    meter: Throughput
    stop: StopFlag
    total_steps: int
    steps_per_epoch: int
    step: int = 0
    epoch: int = 0
    last_loss: float | None = None
    inputs: InputPipeline | None = None  # the runner sets it: decode/move, bad samples
    loss_scale: float = 1.0  # b_r * W / B with --batch-weights (trainer.balance)
    micro: int = 1  # forward/backward passes per step (gradient accumulation, after a shrink)
    global_batch: int = 0  # images per optimizer step, all ranks together
    events: EventLog | None = None  # rank 0's TensorBoard event files
    top5: float | None = None  # the last validation's top-5 accuracy
    forward_time: ForwardTimer = dataclasses.field(default_factory=ForwardTimer)  # per interval


def _first_nonfinite(run: Run, bad_step: torch.Tensor) -> int:
    """Collective: the first step of this interval whose loss was NaN or infinite on any
    rank (0: none). One device sync: called at checkpoints and on a non-finite interval."""
    steps = [int(s) for s in dist_utils.gather_objects(run.env, int(bad_step.item())) if s]
    return min(steps, default=0)


def _log_interval(run: Run, loss_sum: torch.Tensor, count: int, bad_step: torch.Tensor) -> bool:
    """All-reduce the interval's loss, throughput and stop signals; rank 0 writes a row.

    ``count``: the interval's steps that had samples (a zero-weight step adds nothing to the
    mean loss). When any rank met new unreadable files, the ranks gather them, so that the
    limit counts each distinct file once (BadSamplesError on every rank alike).

    The heartbeat gets this rank's own seconds per image (``Throughput.sec_per_image``), read
    after the all-reduce so that CUDA's forward timings need no sync of their own.

    Returns whether the ranks agreed to stop: the stop signal rides on this all-reduce, the
    loop's only collective besides DDP's, so a stop costs nothing between log intervals.
    A non-finite loss sum (the same on every rank) raises NonFiniteError on every rank.
    """
    rate = run.meter.interval()
    inputs = run.inputs
    assert inputs is not None
    new_bad = len(inputs.unshared())
    rates = [0.0] * run.env.world_size  # each rank's own rate, in its slot: for TensorBoard
    rates[run.env.rank] = rate
    sums = [float(loss_sum.item()), float(count), rate, float(run.stop.signum), new_bad]
    sums = dist_utils.all_reduce_sum(run.env, [*sums, run.meter.wait_fraction, *rates])
    total_loss, total_count, total_rate, signalled, new_bad, waits = sums[:6]
    if new_bad:  # the same on every rank: all gather (rarely: only new bad files)
        inputs.agree(dist_utils.gather_objects(run.env, inputs.unshared()))  # type: ignore[arg-type]
    if not math.isfinite(total_loss):
        step = _first_nonfinite(run, bad_step) or run.step
        raise NonFiniteError(f"loss became non-finite at step {step}", step)
    run.last_loss = total_loss / max(total_count, 1.0)
    own = run.meter.sec_per_image(run.forward_time.seconds())  # CUDA: its events are done now
    run.heartbeat.interval(run.last_loss, total_rate, rate, own, run.step)
    lr = run.optimizer.param_groups[0]["lr"]
    row = {
        "step": run.step,
        "epoch": run.epoch,
        "loss": round(run.last_loss, 6),
        "lr": lr,
        "images_per_sec": round(total_rate, 2),
        "data_wait_fraction": round(waits / run.env.world_size, 4),
    }
    if run.events is not None:
        run.events.interval(run.step, row, sums[6:])
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
    return run.stop.settle(signalled)


def stop_agreed(run: Run) -> bool:
    """Collective: True on every rank when any rank got a stop signal."""
    return run.stop.settle(dist_utils.agree_max(run.env, run.stop.signum))


def train_one_epoch(
    run: Run, loader: DataLoader, on_checkpoint: Callable[[int], None]
) -> tuple[bool, int]:
    """Train until the epoch, the step budget or a stop signal ends it.

    Returns (stopped, batches done). The ranks agree on stopping at each log interval (and
    the epoch's last step), in the interval's all-reduce, so all leave at the same step.
    A batch without a readable sample is a zero-weight step: the forward and backward run,
    so this rank's gradients (zeros) join DDP's all-reduce like every other rank's.
    """
    cfg, env, beat = run.cfg, run.env, run.heartbeat
    run.model.train()
    beat.progress(phase="train", epoch=run.epoch)
    loss_sum = torch.zeros((), device=env.device)
    bad_step = torch.zeros((), dtype=torch.int64, device=env.device)  # first non-finite loss
    count = weighed = batches = 0  # steps in the interval, those of them with samples
    fetched = time.perf_counter()
    for images, labels in loader:
        run.meter.waited(time.perf_counter() - fetched)
        beat.progress()
        x, y = run.inputs(images, labels, loader.dataset)  # type: ignore[misc]
        run.optimizer.zero_grad(set_to_none=True)
        loss = forward_backward(run, x, y)
        run.scaler.step(run.optimizer)
        run.scaler.update()
        run.scheduler.step()
        run.step += 1
        batches += 1
        loss_sum += loss  # scaled: the ranks' mean is the global batch's
        bad_step.masked_fill_(~torch.isfinite(loss_sum) & (bad_step == 0), run.step)  # no sync
        count += 1
        weighed += bool(len(y))
        done = run.step >= run.total_steps
        if done and env.device.type == "cuda":
            torch.cuda.synchronize(env.device)  # the last step's time includes its GPU work
        run.meter.step(len(y))
        beat.progress(step=run.step)
        if run.step % cfg.log_every == 0 or done:
            stopped = _log_interval(run, loss_sum, weighed, bad_step)
            loss_sum.zero_()
            bad_step.zero_()
            count = weighed = 0
            if stopped:
                return True, batches
        if cfg.checkpoint_every and run.step % cfg.checkpoint_every == 0 and not done:
            if bad := _first_nonfinite(run, bad_step):  # no checkpoint after a NaN loss
                raise NonFiniteError(f"loss became non-finite at step {bad}", bad)
            on_checkpoint(batches)
        if done:
            break
        fetched = time.perf_counter()
    stopped = bool(count) and _log_interval(run, loss_sum, weighed, bad_step)  # epoch's last
    return stopped, batches


@torch.no_grad()
def evaluate(run: Run, loader: DataLoader) -> float | None:
    """Top-1 accuracy over the whole split, summed over ranks (padded samples included);
    the top-5 goes into ``run.top5``.

    Every ``log_every`` batches the ranks agree on stopping (each rank has as many batches:
    the sampler pads); a stop abandons validation and returns None, so that the stop
    checkpoint is written before the grace period runs out.
    """
    model = run.raw_model
    run.heartbeat.progress(phase="validate")
    dist_utils.sync_buffers(run.env, model)
    model.eval()
    correct = torch.zeros(2, dtype=torch.int64, device=run.env.device)  # top-1, top-5
    total = 0
    for batch, (images, labels) in enumerate(loader, start=1):
        x, y = run.inputs(images, labels, loader.dataset)  # type: ignore[misc]
        if len(y):  # no readable sample: nothing to score (no collective skipped)
            with autocast(run.env.device, run.amp_dtype):
                logits = model(x)
            best = logits.topk(min(5, logits.shape[1]), dim=1).indices
            hits = best == y[:, None]
            correct += torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum()])
            total += len(y)
        run.heartbeat.progress()
        if batch % run.cfg.log_every == 0 and stop_agreed(run):
            model.train()
            return None
    c1, c5, t = dist_utils.all_reduce_sum(run.env, [*map(float, correct.tolist()), float(total)])
    model.train()
    run.top5 = c5 / max(t, 1.0)
    return c1 / max(t, 1.0)


def train_epochs(
    run: Run,
    train_loader: DataLoader,
    val_loader: DataLoader | None,
    start_batch: int,
    epochs: int,
    *,
    save: Callable[[int], None],
) -> tuple[bool, float | None, int]:
    """Epochs until done or stopped; returns (stopped, last accuracy, batch in epoch).

    ``save(batch_in_epoch)`` writes a checkpoint (trainer.checkpoint.save_run)."""
    accuracy = None
    stopped = False
    while run.step < run.total_steps and run.epoch < epochs and not stopped:
        train_loader.sampler.set_epoch(run.epoch)
        train_loader.sampler.set_start_batch(start_batch, train_loader.batch_size)
        stopped, batches = train_one_epoch(run, train_loader, lambda b, s=start_batch: save(s + b))
        start_batch += batches
        if not stopped and start_batch >= run.steps_per_epoch:
            if val_loader is not None:
                stopped, accuracy = _validate(run, val_loader, accuracy)
            run.epoch, start_batch = run.epoch + 1, 0
    if not stopped and val_loader is not None and start_batch:  # ended by --max-steps
        stopped, accuracy = _validate(run, val_loader, accuracy)
    return stopped, accuracy, start_batch


def _validate(run: Run, loader: DataLoader, last: float | None) -> tuple[bool, float | None]:
    """(stopped, accuracy): a stop abandons validation, and the last accuracy stands."""
    with run.meter.paused():
        accuracy = evaluate(run, loader)
    if accuracy is None:
        LOG.info("epoch %d validation abandoned: stopping", run.epoch)
        return True, last
    LOG.info("epoch %d validation accuracy %.4f", run.epoch, accuracy)
    if run.events is not None and run.top5 is not None:
        run.events.validation(run.step, accuracy, run.top5)
    # a signal during the last batches stops here, not after the next epoch's first steps
    return run.step < run.total_steps and stop_agreed(run), accuracy
