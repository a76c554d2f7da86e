"""Image decoding: the choice of path, and the per-sample decode on the CPU.

Every sample gets a *plan* first (trainer.crops: a box in source pixels and a flip flag, a
function of (seed, epoch, index) and the image's size only); then one chain executes it,
wherever it runs: crop, antialiased bilinear resize to size x size, flip, rounded to uint8.
So CPU and GPU decoding see the same crops, and a run resumed mid-epoch sees exactly the
batches an uninterrupted run would have seen.

- ``cpu``: the loader workers decode (here). JPEGs go to ``libddpfleet_jpeg`` (trainer.jpeg,
  built into the image): only the box's rows and columns are reconstructed, and where the box
  is at least twice the output size on its short side, at 1/2, 1/4 or 1/8 scale (libjpeg's
  DCT scaling), so the decoded box is still at least the output size. Its pixels are exactly
  those of the whole-file path, which is the fallback (no library, a file it cannot do, a
  file not ending in EOI): PIL at the same DCT scale (``Image.draft``), else torchvision's
  libjpeg-turbo decoder straight into a tensor. Other formats: PIL.
- ``gpu`` (trainer.decode_gpu): the workers only read bytes and the JPEG header (size ->
  plan); the rank decodes the whole batch with nvJPEG (``torchvision.io.decode_jpeg(list,
  device="cuda")``) and runs the same chain on the GPU. Files that are not JPEG are done by
  the workers as above.
- ``auto`` (the default): ``cpu`` off CUDA; on CUDA ``cpu`` where the loader workers have
  ``AUTO_CPU_LOADER_CORES`` cores or more between them, else ``gpu`` (``decode_choice``).

An unreadable sample is not an exception here: its label comes back as ``-1 - index`` (see
``trainer.inputs``, which skips, logs and counts them).
"""

from __future__ import annotations

import io
import math
import os
import warnings

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from trainer import jpeg
from trainer.cpus import cpu_quota
from trainer.crops import Planner, crop_resize, draft_factor

# torchvision 0.29 marks its image codecs deprecated in favour of TorchCodec (not in the image).
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities")

JPEG_MAGIC = b"\xff\xd8\xff"
JPEG_EOI = b"\xff\xd9"
# What reading or decoding a bad file raises (UnidentifiedImageError is an OSError).
UNREADABLE = (OSError, ValueError, RuntimeError, SyntaxError, Image.DecompressionBombError)


# ``--decode auto`` on CUDA decodes on the CPU from this many loader cores per rank. nvJPEG
# here is serial with training: ~35 ms of the rank's own CPU per 256-image batch (decode and
# per-sample crops), so it caps one H200 at ~2,700-3,000 img/s whatever the host has; the
# workers scale with their cores. Measured on an H200 with 16 Xeon cores (bench/README.md):
# gpu won with 1, 3 and 4 loader cores (2,604 vs 653 img/s; 2,862 vs 1,368; 2,690 vs 1,830
# and vs 2,535 with the region decoder), cpu with 6 and 8 (4,454 vs 2,909; 4,545 vs 2,997).
AUTO_CPU_LOADER_CORES = 6


def loader_cores(workers: int, local_ranks: int) -> int:
    """Cores one rank's loader workers can use: one each at most, within the rank's share of
    the CPUs this process may run on (affinity, cgroup quota), less one for the rank itself."""
    cpus = len(os.sched_getaffinity(0))
    quota = cpu_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return max(0, min(workers, cpus // max(1, local_ranks) - 1))


def decode_choice(requested: str, device_type: str, cores: int = 0) -> str:
    """``--decode``: auto is cpu off CUDA, and on CUDA cpu where the loader workers have
    ``cores`` >= AUTO_CPU_LOADER_CORES (``loader_cores``), else gpu; gpu needs CUDA
    (ValueError)."""
    if requested == "auto":
        return "cpu" if device_type != "cuda" or cores >= AUTO_CPU_LOADER_CORES else "gpu"
    if requested == "gpu" and device_type != "cuda":
        raise ValueError("--decode gpu needs a CUDA device")
    return requested


def collate_samples(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack CPU-decoded samples into an NCHW batch with channels_last strides: the images
    come out of crop_resize in that layout, so this is a memcpy, and so is the model's
    channels_last input on the device (no transpose anywhere)."""
    images, labels = zip(*samples, strict=True)
    batch = torch.stack([img.permute(1, 2, 0) for img in images]).permute(0, 3, 1, 2)
    return batch, torch.tensor(labels, dtype=torch.int64)


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the JPEG header alone (PIL reads no pixels here)."""
    with Image.open(io.BytesIO(data)) as im:
        return im.size


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def decode_cpu(data: bytes, plan: Planner, epoch: int, index: int) -> torch.Tensor:
    """Decode and transform one file on the CPU (raises one of UNREADABLE if it is bad)."""
    if jpeg.REGION is not None and data[:3] == JPEG_MAGIC:
        img = _decode_jpeg_region(jpeg.REGION, data, plan, epoch, index)
        if img is not None:
            return img
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        box, flip = plan(w, h, epoch, index)
        k = draft_factor(box, plan.size) if im.format == "JPEG" else 1
        if k == 1 and data[:3] == JPEG_MAGIC:
            img = decode_jpeg(_bytes_tensor(data), mode=ImageReadMode.RGB)
        else:
            if k > 1:
                im.draft("RGB", (w // k, h // k))
            rgb = im if im.mode == "RGB" else im.convert("RGB")
            img = torch.from_numpy(np.array(rgb)).permute(2, 0, 1)
    sx, sy = img.shape[2] / w, img.shape[1] / h
    if (sx, sy) != (1.0, 1.0):
        box = (round(box[0] * sx), round(box[1] * sy), round(box[2] * sx), round(box[3] * sy))
    return crop_resize(img, box, flip, plan.size)


def _decode_jpeg_region(
    region: jpeg.RegionDecoder, data: bytes, plan: Planner, epoch: int, index: int
) -> torch.Tensor | None:
    """The crop's rows and columns only, at the largest DCT scale that keeps the crop at
    least the output size (libddpfleet_jpeg); None where the library cannot do this file.

    A file that does not end in EOI goes to the whole-file decoders: the region decode reads
    nothing below the crop, so a truncated file would pass in one epoch and fail in the next;
    they call it bad every time (and a valid file with bytes after EOI is only slower)."""
    if not data.endswith(JPEG_EOI):
        return None
    size = region.size(data)
    if size is None:
        return None
    w, h = size
    box, flip = plan(w, h, epoch, index)
    k = draft_factor(box, plan.size)
    sw, sh = -(-w // k), -(-h // k)  # libjpeg's scaled size
    if k > 1:
        box = (
            round(box[0] * sw / w),
            round(box[1] * sh / h),
            max(round(box[2] * sw / w), round(box[0] * sw / w) + 1),
            max(round(box[3] * sh / h), round(box[1] * sh / h) + 1),
        )
    got = region.decode(data, k, box, sw)
    if got is None:
        return None
    rows, first = got
    left, top, right, bottom = box
    img = rows.permute(2, 0, 1)  # CHW view, channels_last strides
    return crop_resize(img, (left - first, 0, right - first, bottom - top), flip, plan.size)
