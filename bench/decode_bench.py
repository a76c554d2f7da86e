"""CPU JPEG decode benchmark: the trainer's old per-sample path against ``--decode cpu``.

    .venv/bin/python bench/decode_bench.py            # make bench-decode: ~500 px JPEGs, 224 px

One process, one thread (figures are per core). It writes ``--count`` photo-like JPEGs
(smooth colour fields with grain, quality 90, long side ``--source`` px, landscape and
portrait, 4:3 and 3:2) to memory, then turns each into a training sample of
``--image-size`` px, the same random-resized crop and flip for both paths:

(a) before: PIL decodes the whole file, ``convert("RGB")``, ``resize(box=crop)`` with
    bilinear filtering, flip, ``pil_to_tensor`` (trainer/data.py until the decode paths);
(b) now: ``trainer.decode.decode_cpu``: a reduced-size decode (PIL ``draft``, JPEG DCT
    scaling) where the crop is at least twice the output size, else libjpeg-turbo straight
    into a tensor; crop, antialiased bilinear resize (torch's uint8 kernel) and flip.

Each path runs over every file ``--rounds`` times, alternating; a round's rate is files per
CPU second of this process (``time.process_time``: other load on a shared machine does not
count against either path), and the best round counts. Prints JPEGs/s per core for both,
how often (b) could decode at reduced size, and the ratio, last.
"""

from __future__ import annotations

import argparse
import io
import sys
import time

import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

from trainer.decode import Planner, decode_cpu, draft_factor, jpeg_size

SHAPES = ((4, 3), (3, 4), (3, 2), (2, 3))


def photo_like(i: int, long_side: int) -> bytes:
    """A JPEG with smooth colour regions and grain, like a photo's mix of flat and detailed."""
    g = torch.Generator().manual_seed(i)
    a, b = SHAPES[i % len(SHAPES)]
    w, h = (long_side, long_side * b // a) if a > b else (long_side * a // b, long_side)
    coarse = torch.randint(0, 256, (max(1, h // 24), max(1, w // 24), 3), generator=g)
    img = F.resize(coarse.permute(2, 0, 1).float().unsqueeze(0), [h, w], antialias=False)
    grain = torch.randint(-14, 15, (1, 3, h, w), generator=g)
    pixels = (img + grain).clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0).contiguous()
    buf = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def before(data: bytes, plan: Planner, index: int) -> torch.Tensor:
    """The trainer's per-sample path before ``--decode`` existed (train split)."""
    with Image.open(io.BytesIO(data)) as im:
        img = im.convert("RGB")
    box, flip = plan(*img.size, 0, index)
    s = plan.size
    img = img.resize((s, s), Image.BILINEAR, box=box)
    if flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return F.pil_to_tensor(img)


def now(data: bytes, plan: Planner, index: int) -> torch.Tensor:
    return decode_cpu(data, plan, 0, index)


def rate(fn, files: list[bytes], plan: Planner) -> float:
    """Files per CPU second of this process (per core, and robust to other load)."""
    start = time.process_time()
    for i, data in enumerate(files):
        fn(data, plan, i)
    return len(files) / (time.process_time() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=96, help="JPEG files")
    p.add_argument("--source", type=int, default=500, help="long side of the files, px")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    files = [photo_like(i, a.source) for i in range(a.count)]
    plan = Planner(a.image_size, train=True, seed=0)
    for i in range(4):  # same output for both paths (shape, dtype) before timing anything
        assert before(files[i], plan, i).shape == now(files[i], plan, i).shape
    reduced = sum(
        draft_factor(plan(*jpeg_size(d), 0, i)[0], a.image_size) > 1 for i, d in enumerate(files)
    )
    best = {"before": 0.0, "now": 0.0}
    for _ in range(a.rounds):
        best["before"] = max(best["before"], rate(before, files, plan))
        best["now"] = max(best["now"], rate(now, files, plan))
    kb = sum(map(len, files)) / len(files) / 1024
    out = sys.stdout
    out.write(
        f"{a.count} JPEGs, long side {a.source} px, {kb:.0f} KiB each, to {a.image_size} px; "
    )
    out.write(f"1 thread, CPU time, best of {a.rounds} rounds\n")
    out.write(
        f"before (PIL full decode, convert, resize): {best['before']:7.1f} JPEGs/s per core\n"
    )
    out.write(f"now (--decode cpu):                        {best['now']:7.1f} JPEGs/s per core\n")
    out.write(f"crops decoded at reduced size (draft): {reduced}/{a.count}\n")
    out.write(f"ratio now/before: {best['now'] / best['before']:.2f}x\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
