"""Unequal per-rank shares of one global batch (``--batch-weights``).

The global batch stays ``batch_size * world_size``; rank r takes ``b_r`` of its images, a
largest-remainder split proportional to the weights. The mathematics stay those of the
global batch: DDP averages the ranks' gradients (divides by W), so rank r back-propagates
its mean loss times ``b_r * W / B`` (``loss_scale``) and the all-reduced gradient is the
mean over all B images, as with equal shares.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Sampler

from ddpfleet_agent import stragglers
from ddpfleet_agent.restarts import WEIGHTS_ENV
from trainer.config import BadInputError
from trainer.model import autocast

if TYPE_CHECKING:
    from trainer.engine import Run


def parse_weights(text: str, name: str = "--batch-weights") -> list[float] | None:
    """``"3,1"`` -> ``[3.0, 1.0]``; ``""`` -> None (equal shares). Positive finite floats;
    ``name`` (the flag or variable they came from) begins the error."""
    if not text.strip():
        return None
    weights = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise BadInputError(f"{name} {text}: {part.strip()!r} is not a number") from None
        if not math.isfinite(value):
            raise BadInputError(f"{name} {text}: weights must be finite (got {value})")
        if value <= 0:
            raise BadInputError(f"{name} {text}: weights must be positive (got {value})")
        weights.append(value)
    return weights


def split_batch(
    global_batch: int, weights: Sequence[float], name: str = "--batch-weights"
) -> list[int]:
    """Largest-remainder split of ``global_batch`` proportional to ``weights``
    (ddpfleet_agent.stragglers.split: the agents work out the same shares); refuses a zero
    share (``name``: where the weights came from)."""
    shares = stragglers.split(global_batch, weights)
    for r, share in enumerate(shares):
        if share == 0:
            raise BadInputError(
                f"{name}: rank {r}'s share of the global batch of {global_batch} "
                "images rounds to 0; raise its weight or --batch-size"
            )
    return shares


def rank_batches(text: str, batch_size: int, world: int) -> list[int]:
    """Every rank's local batch: ``batch_size`` each without weights, else the split of
    ``batch_size * world``. BadInputError for malformed weights or a count other than W."""
    weights = parse_weights(text)
    if weights is None:
        return [batch_size] * world
    if len(weights) != world:
        raise BadInputError(
            f"--batch-weights {text}: {len(weights)} weight(s) for {world} rank(s); "
            "give one per global rank"
        )
    return split_batch(batch_size * world, weights)


def attempt_batches(
    text: str,
    batch_size: int,
    world: int,
    full_world: int = 0,
    kept: Sequence[int] | None = None,
    *,
    weights: Sequence[float] | None = None,
) -> tuple[list[int], list[int]]:
    """(every rank's share of the global batch, the most images it takes in one forward).

    A run that goes on without a host (its agents' ``--min-hosts``) keeps the first attempt's
    global batch ``batch_size * full_world``: ``kept`` names the first attempt's global ranks
    that remain, in the new ranks' order, and the batch is split again by their weights.
    ``weights`` (the agents' after a rebalance, ``$DDPFLEET_BATCH_WEIGHTS``: one per global
    rank of the first world) replace ``text``'s for that split, never for the global batch.
    A rank whose new share is more than its first attempt's share (what its memory was sized
    for) takes it in micro-batches of at most that (gradient accumulation: trainer.engine)."""
    full = full_world or world
    first = rank_batches(text, batch_size, full)
    order = list(range(full)) if kept is None else list(kept)
    if len(order) != world or len(set(order)) != world or not all(0 <= r < full for r in order):
        raise BadInputError(
            f"kept ranks {order} do not name {world} distinct rank(s) of the first {full}"
        )
    most = [first[r] for r in order]
    if weights is not None:
        if len(weights) != full:
            raise BadInputError(
                f"${WEIGHTS_ENV}: {len(weights)} weight(s) for the first attempt's {full} "
                "rank(s); give one per global rank of the first world"
            )
        return split_batch(sum(first), [weights[r] for r in order], f"${WEIGHTS_ENV}"), most
    if world == full:
        return most, most
    shares = parse_weights(text) or [1.0] * full
    return split_batch(sum(first), [shares[r] for r in order]), most


def micro_batches(share: int, most: int) -> int:
    """How many forward/backward passes take ``share`` images at most ``most`` at a time."""
    return max(1, -(-share // max(most, 1)))


def loss_scale(local_batch: int, global_batch: int, world: int) -> float:
    """``b_r * W / B``: 1.0 exactly for equal shares."""
    return local_batch * world / global_batch


def scaled_loss(loss: torch.Tensor, scale: float) -> torch.Tensor:
    """What rank r back-propagates (and logs): its mean loss times ``loss_scale``."""
    return loss if scale == 1.0 else loss * scale


def forward_backward(run: Run, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Forward and backward of this rank's share of the step, in ``run.micro`` pieces
    (gradient accumulation: DDP all-reduces in the last piece's backward only). Each piece's
    mean loss is weighed by its part of the share, so the gradient is the one of the whole
    share at once (BatchNorm's statistics aside); returns the share's loss as DDP averages it
    (times ``loss_scale``: the ranks' mean is the global batch's). The forwards (model and
    criterion) count in ``run.forward_time``: the backward waits for peers in DDP's
    all-reduce, the forward never does."""
    pieces = list(zip(x.tensor_split(run.micro), y.tensor_split(run.micro), strict=True))
    total = torch.zeros((), device=x.device)
    no_sync = getattr(run.model, "no_sync", None)  # DDP's (a world of one is not wrapped)
    for i, (xs, ys) in enumerate(pieces):
        last = i == len(pieces) - 1
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            with run.forward_time.timed(run.env.device), autocast(run.env.device, run.amp_dtype):
                out = run.model(xs)
                loss = run.criterion(out, ys) if len(ys) else out.float().sum() * 0.0
            part = len(ys) / len(y) if len(y) else 1 / len(pieces)
            loss = scaled_loss(loss, run.loss_scale * part)
            run.scaler.scale(loss).backward()
        total += loss.detach().float()
    return total


class WeightedDistributedSampler(Sampler):
    """Rank ``rank``'s part of every global batch of a seeded per-epoch permutation.

    Step s covers ``perm[s*B:(s+1)*B]`` (B = ``sum(batches)``), cut at the ranks' cumulative
    local batches; ``len(dataset) // B`` steps on every rank (the remainder is dropped).
    Yields ``(epoch, index)`` like ``data.EpochSampler``; the loader's batch size must
    be ``batches[rank]``.
    """

    def __init__(self, length: int, batches: Sequence[int], rank: int, *, seed: int = 0):
        self.length, self.seed, self.epoch = length, seed, 0
        self.global_batch, self.batch = sum(batches), batches[rank]
        self.offset = sum(batches[:rank])
        self.steps = length // self.global_batch
        self.start_step = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_start_batch(self, batch: int, batch_size: int) -> None:
        """Skip the epoch's first ``batch`` steps. Counted in steps, so ``batch_size`` (the
        runner's ``--batch-size``) does not matter: each skipped step is the local batch."""
        del batch_size
        self.start_step = batch

    def permutation(self) -> list[int]:
        """The epoch's order of the whole data set, the same on every rank."""
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.length, generator=g).tolist()

    def __iter__(self) -> Iterator[tuple[int, int]]:
        perm, epoch, size = self.permutation(), self.epoch, self.global_batch
        starts = range(self.start_step * size + self.offset, self.steps * size, size)
        return iter([(epoch, i) for s in starts for i in perm[s : s + self.batch]])

    def __len__(self) -> int:
        return max(0, self.steps - self.start_step) * self.batch
