"""Each sample's crop: the *plan* (a box in source pixels and a flip flag) and the chain that
executes it, the same on the CPU (trainer.decode) and on the GPU (trainer.decode_gpu).

A plan is a function of (seed, epoch, index) and the image's size only: train draws an
Inception random-resized crop and a coin flip; val takes the centre crop that "short side to
size/0.875, centre crop size" shows. So both decode paths see the same crops, and a run
resumed mid-epoch sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch.nn import functional as TF

Box = tuple[int, int, int, int]


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 1_000_000_007 + index)


def random_resized_crop(w: int, h: int, g: torch.Generator) -> Box:
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


def center_box(w: int, h: int, size: int) -> Box:
    """The source region that resizing the short side to round(size / 0.875) and taking the
    central size x size square shows."""
    side = max(1, min(w, h, round(min(w, h) * size / round(size / 0.875))))
    left, top = (w - side) // 2, (h - side) // 2
    return left, top, left + side, top + side


@dataclasses.dataclass(frozen=True)
class Planner:
    """The plan of one split: train (random crop + flip per (epoch, index)) or val (centre)."""

    size: int
    train: bool
    seed: int

    def __call__(self, w: int, h: int, epoch: int, index: int) -> tuple[Box, bool]:
        if not self.train:
            return center_box(w, h, self.size), False
        g = sample_generator(self.seed, epoch, index)
        box = random_resized_crop(w, h, g)
        return box, torch.rand(1, generator=g).item() < 0.5


def draft_factor(box: Box, size: int) -> int:
    """The largest JPEG DCT scale (8, 4, 2, else 1) at which the box still covers at least
    size x size decoded pixels."""
    short = min(box[2] - box[0], box[3] - box[1])
    return next((k for k in (8, 4, 2) if short // k >= size), 1)


def crop_resize(img: torch.Tensor, box: Box, flip: bool, size: int) -> torch.Tensor:
    """uint8 CHW image -> uint8 (3, size, size): crop, antialiased bilinear resize, flip.
    (On the CPU torch's uint8 kernel for channels_last input: the fast one.)

    The same chain on any device; off the CPU it resizes in float and rounds (CUDA's
    antialiased kernel has no uint8 variant)."""
    left, top, right, bottom = box
    x = img[:, top:bottom, left:right].unsqueeze(0)
    if x.shape[-2:] != (size, size):
        if x.device.type == "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
            x = TF.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
        else:
            x = TF.interpolate(x.float(), size=(size, size), mode="bilinear", antialias=True)
            x = x.round_().clamp_(0, 255).to(torch.uint8)
    if flip:
        x = x.flip(-1)
    return x[0]  # on the CPU: channels_last strides, which decode.collate_samples stacks as is
