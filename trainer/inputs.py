"""From a loader batch to what the model eats: decode on the GPU (``--decode gpu``) or move
and normalise (CPU-decoded uint8 batches), and skip unreadable samples.

A bad sample (truncated or corrupt file, unreadable, not an image) comes out of the data set
with label ``-1 - index``; here it is dropped from the batch, its path logged once and kept.
Ranks add their counts up at every log interval; more than ``--max-bad-samples`` in all
fails the run with the paths (BadSamplesError), before that they are counted in summary.json.
"""

from __future__ import annotations

import logging

import torch
from torch.utils.data import Dataset

from trainer.data import mean_std, to_device
from trainer.decode import EncodedBatch, decode_batch

LOG = logging.getLogger("trainer")
SHOWN_PATHS = 20  # paths named in the error and the summary at most


class BadSamplesError(Exception):
    """More unreadable samples than --max-bad-samples."""


def sample_path(dataset: Dataset, index: int) -> str:
    samples = getattr(getattr(dataset, "folder", None), "samples", None)
    return str(samples[index][0]) if samples is not None else f"sample {index}"


def bad_samples_message(paths: list[str], limit: int) -> str:
    shown = ", ".join(paths[:SHOWN_PATHS]) + (" ..." if len(paths) > SHOWN_PATHS else "")
    return f"{len(paths)} unreadable samples, more than --max-bad-samples {limit}: {shown}"


class InputPipeline:
    """Callable per rank: (images or EncodedBatch, labels, dataset) -> (x, y) on the device."""

    def __init__(self, device: torch.device, size: int, channels_last: bool, max_bad: int) -> None:
        self.device, self.size = device, size
        self.channels_last, self.max_bad = channels_last, max_bad
        self.norm = mean_std(device)
        self.bad_paths: list[str] = []  # this rank's, in the order met, each once

    def __call__(
        self, images: torch.Tensor | EncodedBatch, labels: torch.Tensor, dataset: Dataset
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bad = labels < 0
        if isinstance(images, EncodedBatch):
            index = images.meta[:, 6]
            images, undecodable = decode_batch(images, self.device, self.size)
            labels = torch.where(undecodable, -1 - index, labels)
            bad |= undecodable
        if bool(bad.any()):
            self._record(labels, bad, dataset)
            keep = ~bad
            if not bool(keep.any()):
                raise BadSamplesError(
                    "every sample of a batch is unreadable: " + ", ".join(self.bad_paths[-8:])
                )
            images, labels = images[keep.to(images.device)], labels[keep]
        x = to_device(images, self.device, self.channels_last, self.norm)
        return x, labels.to(self.device, non_blocking=True)

    def _record(self, labels: torch.Tensor, bad: torch.Tensor, dataset: Dataset) -> None:
        for code in labels[bad].tolist():
            path = sample_path(dataset, -1 - int(code))
            if path not in self.bad_paths:
                self.bad_paths.append(path)
                LOG.warning("skipped unreadable sample %s", path)

    def check(self, total_bad: int, gathered: list[list[str]] | None = None) -> None:
        """Raise BadSamplesError once the ranks' total is over the limit (every rank at once:
        ``total_bad`` comes from an all-reduce; ``gathered`` are all ranks' paths)."""
        if total_bad > self.max_bad:
            paths = sorted({p for ps in (gathered or [self.bad_paths]) for p in ps})
            raise BadSamplesError(bad_samples_message(paths, self.max_bad))
