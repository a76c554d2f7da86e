"""Write a small, real, learnable ImageFolder data set of JPEG files (nothing downloaded).

    python -m trainer.make_dataset --out DIR --classes 4 --train-per-class 32 \\
        --val-per-class 8 --size 64

Layout: ``DIR/train/class_XX/NNNNN.jpg`` and ``DIR/val/class_XX/NNNNN.jpg``. Each class
has its own colour and shape (ellipse, rectangle, triangle, bars...) drawn at random
positions over noise, so a classifier can learn it and crops keep the signal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from PIL import Image, ImageDraw

SHAPES = ("ellipse", "rectangle", "triangle", "bars")


def _colour(cls: int, classes: int) -> tuple[int, int, int]:
    """Well-separated hues per class."""
    h = cls / classes
    img = Image.new("HSV", (1, 1), (round(h * 255), 200, 220)).convert("RGB")
    return img.getpixel((0, 0))  # type: ignore[return-value]


def draw_sample(cls: int, classes: int, size: int, g: torch.Generator) -> Image.Image:
    """One RGB image of class ``cls``: noisy background plus the class's shape and colour."""
    noise = torch.randint(60, 140, (size, size, 3), generator=g, dtype=torch.uint8)
    img = Image.frombytes("RGB", (size, size), noise.numpy().tobytes())
    draw = ImageDraw.Draw(img)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    w = r(size // 3, size * 3 // 4)
    x0, y0 = r(0, size - w), r(0, size - w)
    box = (x0, y0, x0 + w, y0 + w)
    colour = _colour(cls, classes)
    shape = SHAPES[cls % len(SHAPES)]
    if shape == "ellipse":
        draw.ellipse(box, fill=colour)
    elif shape == "rectangle":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(x0, y0 + w), (x0 + w // 2, y0), (x0 + w, y0 + w)], fill=colour)
    else:
        for i in range(0, w, max(2, w // 6) * 2):
            draw.rectangle((x0 + i, y0, x0 + i + max(2, w // 6), y0 + w), fill=colour)
    return img


def write_dataset(
    out: Path, classes: int, train_per_class: int, val_per_class: int, size: int, *, seed: int = 0
) -> int:
    """Write the JPEG files; returns how many were written."""
    g = torch.Generator().manual_seed(seed)
    written = 0
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        for cls in range(classes if per_class else 0):
            folder = out / split / f"class_{cls:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                draw_sample(cls, classes, size, g).save(folder / f"{i:05d}.jpg", quality=90)
                written += 1
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trainer.make_dataset", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory to create (must be empty or absent)")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--train-per-class", type=int, default=32)
    p.add_argument("--val-per-class", type=int, default=8)
    p.add_argument("--size", type=int, default=64, help="image side in pixels")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out = Path(a.out)
    problem = None
    if a.classes < 2 or a.train_per_class < 1 or a.val_per_class < 0 or a.size < 8:
        problem = "need --classes >= 2, --train-per-class >= 1, --val-per-class >= 0, --size >= 8"
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):
        problem = f"--out {out}: exists and is not an empty directory (nothing overwritten)"
    if problem:
        sys.stderr.write(f"trainer.make_dataset: error: {problem}\n")
        return 2
    try:
        n = write_dataset(out, a.classes, a.train_per_class, a.val_per_class, a.size, seed=a.seed)
    except OSError as exc:
        sys.stderr.write(f"trainer.make_dataset: error: --out {out}: {exc.strerror}\n")
        return 2
    sys.stdout.write(f"wrote {n} JPEG files under {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
