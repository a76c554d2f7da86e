"""Data sets (ImageFolder, synthetic) yielding uint8 CHW tensors (or JPEG bytes for GPU
decoding, see trainer.decode_gpu), and resumable loaders.

Augmentation randomness is a function of (seed, epoch, sample index) only, so a run
resumed mid-epoch sees exactly the batches an uninterrupted run would have seen, no
matter how many loader workers there are.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler
from torchvision.datasets import ImageFolder

from trainer.balance import WeightedDistributedSampler
from trainer.config import BadInputError, TrainConfig
from trainer.crops import Planner
from trainer.decode import JPEG_MAGIC, UNREADABLE, collate_samples, decode_cpu, jpeg_size
from trainer.decode_gpu import KIND_DECODED, KIND_JPEG, collate_encoded
from trainer.stop import ignore_stop_signals

LOG = logging.getLogger("trainer")

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _split_key(key: int | tuple[int, int]) -> tuple[int, int]:
    """Samplers here yield (epoch, index) so that persistent workers see the epoch."""
    return key if isinstance(key, tuple) else (0, key)


class SyntheticImages(Dataset):
    """Class-dependent noise images: no file I/O, learnable, identical on every rank.

    A bank of ``bank`` images is generated once; sample ``i`` is bank entry ``i % bank``.
    ``split`` changes the noise and labels but not the per-class colour cast.
    """

    def __init__(
        self,
        length: int,
        num_classes: int,
        size: int,
        seed: int,
        *,
        split: int = 0,
        bank: int = 256,
    ):
        self.length = length
        cast = torch.randint(
            0, 256, (num_classes, 3, 1, 1), generator=torch.Generator().manual_seed(seed)
        )
        g = torch.Generator().manual_seed(seed * 7919 + 1 + split)
        n = min(bank, length)
        self.labels = torch.randint(0, num_classes, (n,), generator=g)
        noise = torch.randint(-40, 41, (n, 3, size, size), generator=g, dtype=torch.int16)
        self.images = (cast[self.labels] * 0.6 + 50 + noise).clamp(0, 255).to(torch.uint8)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        j = _split_key(key)[1] % len(self.labels)
        return self.images[j], int(self.labels[j])


def _path_only(path: str) -> str:
    return path


class FolderImages(Dataset):
    """An ImageFolder split; train: random resized crop + flip; val: centre crop.

    ``encoded`` (``--decode gpu``): JPEG files come back as their bytes with the plan (box,
    flip, index; see trainer.decode_gpu) for the rank to decode on the GPU; anything else is
    decoded here. An unreadable file comes back as a blank image with label ``-1 - index``.
    """

    def __init__(self, root: Path, size: int, train: bool, seed: int, *, encoded: bool = False):
        try:
            self.folder = ImageFolder(str(root), loader=_path_only, allow_empty=True)
        except (FileNotFoundError, RuntimeError) as exc:
            raise BadInputError(f"{root}: {str(exc).splitlines()[0]}") from None
        counts = Counter(self.folder.targets)
        empty = [c for i, c in enumerate(self.folder.classes) if counts[i] == 0]
        if empty:
            raise BadInputError(f"{root}: class folder(s) without images: {', '.join(empty)}")
        self.size, self.train, self.seed, self.encoded = size, train, seed, encoded
        self.plan = Planner(size, train, seed)

    @property
    def classes(self) -> list[str]:
        return self.folder.classes

    def __len__(self) -> int:
        return len(self.folder.samples)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple:
        epoch, index = _split_key(key)
        path, label = self.folder.samples[index]
        try:
            data = Path(path).read_bytes()
            if self.encoded and data[:3] == JPEG_MAGIC:
                box, flip = self.plan(*jpeg_size(data), epoch, index)
                meta = [KIND_JPEG, *box, int(flip), index]
                return torch.frombuffer(bytearray(data), dtype=torch.uint8), meta, label
            img = decode_cpu(data, self.plan, epoch, index)
        except UNREADABLE as exc:
            LOG.warning(
                "unreadable sample %s: %s",
                path,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            img, label = torch.zeros((3, self.size, self.size), dtype=torch.uint8), -1 - index
        if self.encoded:
            return img, [KIND_DECODED, 0, 0, 0, 0, 0, index], label
        return img, label


class EpochSampler(DistributedSampler):
    """DistributedSampler yielding (epoch, index): the validation loader's. (Training resumes
    part-way into an epoch: balance.WeightedDistributedSampler.)"""

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter([(self.epoch, i) for i in super().__iter__()])


def build_datasets(
    cfg: TrainConfig, *, encoded: bool = False
) -> tuple[Dataset, Dataset | None, int]:
    """(train, val or None, number of classes); BadInputError for unusable folders.
    ``encoded``: folders yield JPEG bytes for decoding on the GPU (``--decode gpu``)."""
    if cfg.synthetic:
        train = SyntheticImages(cfg.synthetic_size, cfg.num_classes, cfg.image_size, cfg.seed)
        n_val = min(256, cfg.synthetic_size)
        val = SyntheticImages(n_val, cfg.num_classes, cfg.image_size, cfg.seed, split=1)
        return train, val, cfg.num_classes
    root = Path(cfg.data_dir or "")
    train = FolderImages(root / "train", cfg.image_size, train=True, seed=cfg.seed, encoded=encoded)
    val = None
    if (root / "val").is_dir():
        val = FolderImages(
            root / "val", cfg.image_size, train=False, seed=cfg.seed, encoded=encoded
        )
        if val.classes != train.classes:
            raise BadInputError(f"--data-dir {root}: val/ classes differ from train/ classes")
    found = len(train.classes)
    if cfg.num_classes and cfg.num_classes < found:
        raise BadInputError(f"--num-classes {cfg.num_classes}: data set has {found} classes")
    return train, val, cfg.num_classes or found


# The loader's workers are forked whatever the process's default start method is (spawn in a
# rank started by torch.multiprocessing.spawn, forkserver from Python 3.14 on): a spawned worker
# re-imports the main module and is sent the data set's whole sample list through a pipe, one
# worker after the other. On an H200 with 8 workers and 10,400 files that delayed the first batch
# by 82 s (bench/README.md). Workers never touch CUDA (the rank decodes on the GPU), so forking a
# rank that has initialised CUDA is safe.
_WORKER_START = "fork" if "fork" in multiprocessing.get_all_start_methods() else None


def build_loader(
    dataset: Dataset,
    cfg: TrainConfig,
    rank: int,
    world: int,
    *,
    pin: bool,
    train: bool,
    batches: list[int] | None = None,
) -> DataLoader:
    """Per-rank loader; full batches only when training.

    Training: a WeightedDistributedSampler over ``batches[rank]``-image batches (``batches``:
    every rank's share of the global batch, see trainer.balance; ``batch_size`` each when not
    given). Step s takes the same images whatever the world size, so a run that goes on with
    fewer hosts at the same global batch goes on with its epoch. Validation: an EpochSampler."""
    batch_size = cfg.batch_size
    sampler: Sampler
    if train:
        shares = batches or [batch_size] * world
        sampler = WeightedDistributedSampler(len(dataset), shares, rank, seed=cfg.seed)  # type: ignore[arg-type]
        batch_size = shares[rank]
    else:
        sampler = EpochSampler(dataset, num_replicas=world, rank=rank, shuffle=False, seed=cfg.seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=cfg.workers,
        pin_memory=pin,
        drop_last=train,
        persistent_workers=cfg.workers > 0,
        prefetch_factor=4 if cfg.workers > 0 else None,
        multiprocessing_context=_WORKER_START if cfg.workers > 0 else None,
        worker_init_fn=ignore_stop_signals,
        collate_fn=_collate_for(dataset),
    )


def _collate_for(dataset: Dataset) -> Callable[[list], tuple] | None:
    if isinstance(dataset, FolderImages):
        return collate_encoded if dataset.encoded else collate_samples
    return None  # the DataLoader's default: synthetic tensors are contiguous already


def to_device(
    images: torch.Tensor, device: torch.device, channels_last: bool, mean_std: torch.Tensor
) -> torch.Tensor:
    """uint8 NCHW batch -> normalised float on ``device`` (non-blocking from pinned memory)."""
    x = images.to(device, non_blocking=True)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x.float().sub_(mean_std[0]).div_(mean_std[1])


def mean_std(device: torch.device) -> torch.Tensor:
    return torch.tensor([MEAN, STD], device=device).mul_(255).view(2, 1, 3, 1, 1)
