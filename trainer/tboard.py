"""Rank 0's TensorBoard event files in ``<run>/tensorboard/`` (tensorboardX's SummaryWriter:
TensorBoard's format without its server in the image).

Tags, on the optimizer-step axis: ``train/loss``, ``train/lr``, ``train/images_per_sec`` (all
ranks), ``train/data_wait_fraction`` (the ranks' mean share of the interval spent waiting for a
batch), ``val/top1``, ``val/top5``, and per host ``hosts/<host>/images_per_sec`` and
``hosts/<host>/batch_share`` (its share of the global batch). A resumed run purges what the
failed attempt logged after its checkpoint, so the curves go on from there without a fork,
like metrics.jsonl. A user's program (train_program) finds the directory in
$DDPFLEET_TENSORBOARD_DIR.
"""

from __future__ import annotations

from pathlib import Path

from tensorboardX import SummaryWriter

DIR_ENV = "DDPFLEET_TENSORBOARD_DIR"
FLUSH_SECONDS = 5


def per_host(hosts: list[str], rank_values: list[float]) -> dict[str, float]:
    """The ranks' values summed per host (``hosts[rank]`` is rank's host)."""
    summed: dict[str, float] = {}
    for host, value in zip(hosts, rank_values, strict=True):
        summed[host] = summed.get(host, 0.0) + value
    return summed


class EventLog:
    """The writer of one attempt; ``hosts`` and ``batches`` are per rank."""

    def __init__(
        self, directory: Path, resume_step: int | None, hosts: list[str], batches: list[int]
    ):
        self.hosts = hosts
        total = sum(batches) or 1
        self.shares = per_host(hosts, [batch / total for batch in batches])  # of the global batch
        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(str(directory), purge_step=purge, flush_secs=FLUSH_SECONDS)

    def interval(self, step: int, row: dict[str, float], rank_rates: list[float]) -> None:
        """One log interval: metrics.jsonl's row (loss, lr, images_per_sec, data_wait_fraction)
        and each rank's own images/s."""
        for name, value in row.items():
            if name in ("loss", "lr", "images_per_sec", "data_wait_fraction"):
                self.writer.add_scalar(f"train/{name}", value, step)
        for host, rate in per_host(self.hosts, rank_rates).items():
            self.writer.add_scalar(f"hosts/{host}/images_per_sec", rate, step)
            self.writer.add_scalar(f"hosts/{host}/batch_share", self.shares[host], step)

    def validation(self, step: int, top1: float, top5: float) -> None:
        self.writer.add_scalar("val/top1", top1, step)
        self.writer.add_scalar("val/top5", top5, step)

    def close(self) -> None:
        self.writer.close()
