"""From a loader batch to what the model eats: decode on the GPU (``--decode gpu``) or move
and normalise (CPU-decoded uint8 batches), and skip unreadable samples.

A bad sample (truncated or corrupt file, unreadable, not an image) comes out of the data set
with label ``-1 - index``; here it is dropped from the batch, its path logged once and kept.
A batch with no readable sample comes back as its placeholder images with no labels: the
engine still runs the step, with zero weight, so that this rank issues DDP's all-reduce like
the others (raising here, on one rank, left the other ranks waiting in it).

At a log interval where any rank met new bad files, the ranks gather them (``unshared`` ->
``agree``): every rank then holds the same set of distinct paths, however many ranks and
epochs met each file. More than ``--max-bad-samples`` distinct files fail the run on every
rank at once with the paths (BadSamplesError); before that they are counted in summary.json.
"""

from __future__ import annotations

import logging

import torch
from torch.utils.data import Dataset

from trainer.data import mean_std, to_device
from trainer.decode_gpu import EncodedBatch, decode_batch

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
        self.agreed: set[str] = set()  # every rank's, as of the last agree (equal on all)
        self._shared = 0  # how many of bad_paths the other ranks have seen

    @property
    def bad_total(self) -> int:
        """Distinct unreadable files of all ranks, as of the last ``agree``."""
        return len(self.agreed)

    def __call__(
        self, images: torch.Tensor | EncodedBatch, labels: torch.Tensor, dataset: Dataset
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) of the readable samples; (every placeholder image, no labels) when there are
        none, for a zero-weight step."""
        bad = labels < 0
        if isinstance(images, EncodedBatch):
            index = images.meta[:, 6]
            images, undecodable = decode_batch(images, self.device, self.size)
            labels = torch.where(undecodable, -1 - index, labels)
            bad |= undecodable
        if bool(bad.any()):
            self._record(labels, bad, dataset)
            keep = ~bad
            if bool(keep.any()):
                images = images[keep.to(images.device)]
            labels = labels[keep]
        x = to_device(images, self.device, self.channels_last, self.norm)
        return x, labels.to(self.device, non_blocking=True)

    def _record(self, labels: torch.Tensor, bad: torch.Tensor, dataset: Dataset) -> None:
        for code in labels[bad].tolist():
            path = sample_path(dataset, -1 - int(code))
            if path not in self.bad_paths and path not in self.agreed:
                self.bad_paths.append(path)
                LOG.warning("skipped unreadable sample %s", path)

    def unshared(self) -> list[str]:
        """This rank's bad paths that the ranks have not agreed on yet."""
        return self.bad_paths[self._shared :]

    def agree(self, gathered: list[list[str]]) -> None:
        """Take in every rank's ``unshared()`` (an all-gather: every rank calls this with the
        same lists) and raise BadSamplesError on every rank alike when the distinct paths
        are more than the limit."""
        self.agreed.update(p for ps in gathered for p in ps)
        self._shared = len(self.bad_paths)
        if len(self.agreed) > self.max_bad:
            raise BadSamplesError(bad_samples_message(sorted(self.agreed), self.max_bad))
