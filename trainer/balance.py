"""Unequal per-rank shares of one global batch (``--batch-weights``).

The global batch stays ``batch_size * world_size``; rank r takes ``b_r`` of its images, a
largest-remainder split proportional to the weights. The mathematics stay those of the
global batch: DDP averages the ranks' gradients (divides by W), so rank r back-propagates
its mean loss times ``b_r * W / B`` (``loss_scale``) and the all-reduced gradient is the
mean over all B images, as with equal shares.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from fractions import Fraction

import torch
from torch.utils.data import Sampler

from trainer.config import BadInputError


def parse_weights(text: str) -> list[float] | None:
    """``"3,1"`` -> ``[3.0, 1.0]``; ``""`` -> None (equal shares). Positive finite floats."""
    if not text.strip():
        return None
    weights = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            message = f"--batch-weights {text}: {part.strip()!r} is not a number"
            raise BadInputError(message) from None
        if not math.isfinite(value):
            raise BadInputError(f"--batch-weights {text}: weights must be finite (got {value})")
        if value <= 0:
            raise BadInputError(f"--batch-weights {text}: weights must be positive (got {value})")
        weights.append(value)
    return weights


def split_batch(global_batch: int, weights: Sequence[float]) -> list[int]:
    """Largest-remainder split of ``global_batch`` proportional to ``weights`` (exact rational
    arithmetic; ties go to the lower rank). Sums to ``global_batch``; refuses a zero share."""
    exact = [Fraction(w) for w in weights]
    quotas = [global_batch * w / sum(exact) for w in exact]
    shares = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda r: (shares[r] - quotas[r], r))
    for r in by_remainder[: global_batch - sum(shares)]:
        shares[r] += 1
    for r, share in enumerate(shares):
        if share == 0:
            raise BadInputError(
                f"--batch-weights: rank {r}'s share of the global batch of {global_batch} "
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


def loss_scale(local_batch: int, global_batch: int, world: int) -> float:
    """``b_r * W / B``: 1.0 exactly for equal shares."""
    return local_batch * world / global_batch


def scaled_loss(loss: torch.Tensor, scale: float) -> torch.Tensor:
    """What rank r back-propagates (and logs): its mean loss times ``loss_scale``."""
    return loss if scale == 1.0 else loss * scale


class WeightedDistributedSampler(Sampler):
    """Rank ``rank``'s part of every global batch of a seeded per-epoch permutation.

    Step s covers ``perm[s*B:(s+1)*B]`` (B = ``sum(batches)``), cut at the ranks' cumulative
    local batches; ``len(dataset) // B`` steps on every rank (the remainder is dropped).
    Yields ``(epoch, index)`` like ``data.ResumableSampler``; the loader's batch size must
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
