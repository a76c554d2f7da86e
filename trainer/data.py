"""Data sets (ImageFolder, synthetic) yielding uint8 CHW tensors, and resumable loaders.

Augmentation randomness is a function of (seed, epoch, sample index) only, so a run
resumed mid-epoch sees exactly the batches an uninterrupted run would have seen, no
matter how many loader workers there are.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision.datasets import ImageFolder
from torchvision.transforms.v2 import functional as F

from trainer.config import BadInputError, TrainConfig
from trainer.stop import ignore_stop_signals

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _split_key(key: int | tuple[int, int]) -> tuple[int, int]:
    """Samplers here yield (epoch, index) so that persistent workers see the epoch."""
    return key if isinstance(key, tuple) else (0, key)


def _sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 1_000_000_007 + index)


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


def _random_resized_crop(w: int, h: int, g: torch.Generator) -> tuple[int, int, int, int]:
    """Box (left, top, right, bottom) with Inception-style scale (0.08-1) and ratio (3/4-4/3)."""
    area = w * h
    log_lo, log_hi = math.log(3 / 4), math.log(4 / 3)
    for _ in range(10):
        target = area * (0.08 + 0.92 * torch.rand(1, generator=g).item())
        ratio = math.exp(log_lo + (log_hi - log_lo) * torch.rand(1, generator=g).item())
        cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            left = int(torch.randint(0, w - cw + 1, (1,), generator=g))
            top = int(torch.randint(0, h - ch + 1, (1,), generator=g))
            return left, top, left + cw, top + ch
    side = min(w, h)  # fallback: central square
    return (w - side) // 2, (h - side) // 2, (w + side) // 2, (h + side) // 2


def _path_only(path: str) -> str:
    return path


class FolderImages(Dataset):
    """An ImageFolder split read with PIL; train: random resized crop + flip; val: centre crop."""

    def __init__(self, root: Path, size: int, train: bool, seed: int):
        try:
            self.folder = ImageFolder(str(root), loader=_path_only, allow_empty=True)
        except (FileNotFoundError, RuntimeError) as exc:
            raise BadInputError(f"{root}: {str(exc).splitlines()[0]}") from None
        counts = Counter(self.folder.targets)
        empty = [c for i, c in enumerate(self.folder.classes) if counts[i] == 0]
        if empty:
            raise BadInputError(f"{root}: class folder(s) without images: {', '.join(empty)}")
        self.size, self.train, self.seed = size, train, seed

    @property
    def classes(self) -> list[str]:
        return self.folder.classes

    def __len__(self) -> int:
        return len(self.folder.samples)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = _split_key(key)
        path, label = self.folder.samples[index]
        with Image.open(path) as im:
            img = im.convert("RGB")
        s = self.size
        if self.train:
            g = _sample_generator(self.seed, epoch, index)
            img = img.resize((s, s), Image.BILINEAR, box=_random_resized_crop(*img.size, g))
            if torch.rand(1, generator=g).item() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
        else:
            w, h = img.size
            scale = round(s / 0.875) / min(w, h)
            img = img.resize((max(s, round(w * scale)), max(s, round(h * scale))), Image.BILINEAR)
            img = F.center_crop(img, [s, s])
        return F.pil_to_tensor(img), label


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start part-way into an epoch (after a resume)."""

    start_index = 0

    def set_start_batch(self, batch: int, batch_size: int) -> None:
        self.start_index = batch * batch_size

    def __iter__(self) -> Iterator[tuple[int, int]]:
        indices = list(super().__iter__())[self.start_index :]
        return iter([(self.epoch, i) for i in indices])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start_index)


def build_datasets(cfg: TrainConfig) -> tuple[Dataset, Dataset | None, int]:
    """(train, val or None, number of classes); BadInputError for unusable folders."""
    if cfg.synthetic:
        train = SyntheticImages(cfg.synthetic_size, cfg.num_classes, cfg.image_size, cfg.seed)
        n_val = min(256, cfg.synthetic_size)
        val = SyntheticImages(n_val, cfg.num_classes, cfg.image_size, cfg.seed, split=1)
        return train, val, cfg.num_classes
    root = Path(cfg.data_dir or "")
    train = FolderImages(root / "train", cfg.image_size, train=True, seed=cfg.seed)
    val = None
    if (root / "val").is_dir():
        val = FolderImages(root / "val", cfg.image_size, train=False, seed=cfg.seed)
        if val.classes != train.classes:
            raise BadInputError(f"--data-dir {root}: val/ classes differ from train/ classes")
    found = len(train.classes)
    if cfg.num_classes and cfg.num_classes < found:
        raise BadInputError(f"--num-classes {cfg.num_classes}: data set has {found} classes")
    return train, val, cfg.num_classes or found


def build_loader(
    dataset: Dataset, cfg: TrainConfig, rank: int, world: int, *, pin: bool, train: bool
) -> DataLoader:
    """Per-rank loader over a ResumableSampler; full batches only when training."""
    sampler = ResumableSampler(
        dataset, num_replicas=world, rank=rank, shuffle=train, seed=cfg.seed, drop_last=train
    )
    return DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=cfg.workers,
        pin_memory=pin,
        drop_last=train,
        persistent_workers=cfg.workers > 0,
        prefetch_factor=4 if cfg.workers > 0 else None,
        worker_init_fn=ignore_stop_signals,
    )


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
