"""CPU JPEG decode benchmark: the trainer's old per-sample path against ``--decode cpu``.

    .venv/bin/python bench/decode_bench.py            # make bench-decode: ~500 px JPEGs, 224 px

One process, one thread (figures are per core). It writes ``--count`` photo-like JPEGs
(smooth colour fields with grain, quality 90, long side ``--source`` px, landscape and
portrait, 4:3 and 3:2) to memory, then turns each into a training sample of
``--image-size`` px, the same random-resized crop and flip for both paths:

(a) before: PIL decodes the whole file, ``convert("RGB")``, ``resize(box=crop)`` with
    bilinear filtering, flip, ``pil_to_tensor`` (trainer/data.py until the decode paths);
(b) whole files: ``trainer.decode.decode_cpu`` without ``libddpfleet_jpeg``: a reduced-size
    decode (PIL ``draft``, JPEG DCT scaling) where the crop is at least twice the output
    size, else libjpeg-turbo straight into a tensor; crop, antialiased bilinear resize
    (torch's uint8 kernel) and flip;
(c) now (``--decode cpu`` in the image): the same with ``libddpfleet_jpeg``
    (images/trainer/jpegcrop.c): only the crop's rows and columns are reconstructed, at the
    same DCT scale; its pixels are those of (b).

Each path runs over every file ``--rounds`` times, in turn; a round's rate is files per
CPU second of this process (``time.process_time``: other load on a shared machine does not
count against any path), and the best round counts. Prints JPEGs/s per core for each, how
often a crop allowed a reduced-size decode, and the ratio now/before, last. Without the
library (``make venv`` builds it) (c) is left out and the ratio is (b)'s.
"""

from __future__ import annotations

import argparse
import io
import sys
import time

import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

from trainer import jpeg
from trainer.crops import Planner, draft_factor
from trainer.decode import decode_cpu, jpeg_size

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


def whole_files(data: bytes, plan: Planner, index: int) -> torch.Tensor:
    region, jpeg.REGION = jpeg.REGION, None
    try:
        return decode_cpu(data, plan, 0, index)
    finally:
        jpeg.REGION = region


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
    paths = {"before": before, "whole": whole_files}
    if jpeg.REGION is not None:
        paths["now"] = now
    for i in range(4):  # same output for every path (shape, dtype) before timing anything
        assert len({tuple(fn(files[i], plan, i).shape) for fn in paths.values()}) == 1
    reduced = sum(
        draft_factor(plan(*jpeg_size(d), 0, i)[0], a.image_size) > 1 for i, d in enumerate(files)
    )
    best = dict.fromkeys(paths, 0.0)
    for _ in range(a.rounds):
        for name, fn in paths.items():
            best[name] = max(best[name], rate(fn, files, plan))
    kb = sum(map(len, files)) / len(files) / 1024
    out = sys.stdout
    out.write(
        f"{a.count} JPEGs, long side {a.source} px, {kb:.0f} KiB each, to {a.image_size} px; "
    )
    out.write(f"1 thread, CPU time, best of {a.rounds} rounds\n")
    rows = [("before (PIL full decode, convert, resize)", "before")]
    rows.append(("whole files (no libddpfleet_jpeg)", "whole"))
    if "now" in best:
        rows.append(("now (--decode cpu, crop region only)", "now"))
    for label, name in rows:
        out.write(f"{label + ':':43s} {best[name]:7.1f} JPEGs/s per core\n")
    if "now" not in best:
        out.write(f"now: no {jpeg.DEFAULT_PATH} (make venv builds it): whole files only\n")
    out.write(f"crops that allowed a reduced-size decode: {reduced}/{a.count}\n")
    last = best.get("now", best["whole"])
    out.write(f"ratio now/before: {last / best['before']:.2f}x\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
