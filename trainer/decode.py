"""Image decoding and the crop/flip/resize chain: per sample on the CPU, or batched on the GPU.

Every sample gets a *plan* first: a box in source pixels and a flip flag, a function of
(seed, epoch, index) and the image's size only (train: Inception random-resized crop and a
coin flip; val: the centre crop that "short side to size/0.875, centre crop size" takes).
Then one chain executes it, wherever it runs: crop, antialiased bilinear resize to
size x size, flip, rounded to uint8. So CPU and GPU decoding see the same crops, and a run
resumed mid-epoch sees exactly the batches an uninterrupted run would have seen.

- ``cpu``: the loader workers decode. JPEGs go to ``libddpfleet_jpeg`` (trainer.jpeg, built
  into the image): only the box's rows and columns are reconstructed, and where the box is
  at least twice the output size on its short side, at 1/2, 1/4 or 1/8 scale (libjpeg's DCT
  scaling), so the decoded box is still at least the output size. Its pixels are exactly
  those of the whole-file path, which is the fallback (no library, a file it cannot do, a
  file not ending in EOI): PIL at the same DCT scale (``Image.draft``), else torchvision's
  libjpeg-turbo decoder straight into a tensor. Other formats: PIL.
- ``gpu``: the workers only read bytes and the JPEG header (size -> plan); the rank decodes
  the whole batch with nvJPEG (``torchvision.io.decode_jpeg(list, device="cuda")``) and
  runs the same chain on the GPU. Files that are not JPEG are done by the workers as above.
- ``auto`` (the default): ``cpu`` off CUDA; on CUDA ``cpu`` where the loader workers have
  ``AUTO_CPU_LOADER_CORES`` cores or more between them, else ``gpu`` (``decode_choice``).

An unreadable sample is not an exception here: its label comes back as ``-1 - index`` (see
``trainer.inputs``, which skips, logs and counts them).
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import math
import os
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image
from torch.nn import functional as TF
from torchvision.io import ImageReadMode, decode_jpeg

from trainer import jpeg
from trainer.doctor_compute import cpu_quota

# torchvision 0.29 marks its image codecs deprecated in favour of TorchCodec (not in the image).
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities")

JPEG_MAGIC = b"\xff\xd8\xff"
JPEG_EOI = b"\xff\xd9"
# What reading or decoding a bad file raises (UnidentifiedImageError is an OSError).
UNREADABLE = (OSError, ValueError, RuntimeError, SyntaxError, Image.DecompressionBombError)
Box = tuple[int, int, int, int]


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
    return x[0]  # on the CPU: channels_last strides, which collate_samples stacks as they are


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


# An encoded sample: kind, and meta = (left, top, right, bottom, flip, index).
KIND_JPEG, KIND_DECODED = 0, 1


@dataclasses.dataclass
class EncodedBatch:
    """What a loader yields for GPU decoding: every sample's payload (its JPEG bytes, or for
    other formats the finished uint8 CHW image) end to end in one tensor, and per sample its
    kind, box, flip and index.

    One tensor, not one per sample: a loader worker hands each tensor to the rank as a file
    descriptor, held until the rank takes the batch. 256 per batch times the batches in
    flight ran past the 1024 open files Docker gives a container ("received 0 items of
    ancdata"); now a batch is four."""

    data: torch.Tensor  # uint8 (total bytes,)
    offsets: torch.Tensor  # int64 (N + 1,): sample i is data[offsets[i]:offsets[i + 1]]
    meta: torch.Tensor  # int64 (N, 7): kind, left, top, right, bottom, flip, index

    @classmethod
    def pack(cls, payloads: Sequence[torch.Tensor], meta: torch.Tensor) -> EncodedBatch:
        flat = [p.contiguous().reshape(-1) for p in payloads]  # an image: its CHW bytes
        sizes = torch.tensor([0] + [len(f) for f in flat], dtype=torch.int64)
        data = torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8)
        return cls(data, sizes.cumsum(0), meta.to(torch.int64).reshape(len(flat), 7))

    def payloads(self) -> list[torch.Tensor]:
        """Each sample's bytes: views into ``data`` (1-D and contiguous, as nvJPEG wants)."""
        ends = self.offsets.tolist()
        return [self.data[a:b] for a, b in itertools.pairwise(ends)]

    def pin_memory(self) -> EncodedBatch:  # the DataLoader's pin_memory hook: bytes stay put
        return self

    def __len__(self) -> int:
        return len(self.meta)


def collate_encoded(samples: list[tuple[torch.Tensor, list[int], int]]) -> tuple:
    payloads, metas, labels = zip(*samples, strict=True)
    batch = EncodedBatch.pack(payloads, torch.tensor(metas, dtype=torch.int64))
    return batch, torch.tensor(labels, dtype=torch.int64)


_DECODE_STREAMS: dict[int, torch.cuda.Stream] = {}


def decode_batch(
    batch: EncodedBatch, device: torch.device, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 (N, 3, size, size) on ``device``, bool mask of samples that could not be decoded).

    The JPEGs are decoded in one nvJPEG batch; if that fails, one by one (a file nvJPEG
    cannot take is decoded on the CPU instead; only a file nothing can decode is bad).

    On CUDA all of it runs on a stream of its own that is idle when it starts. nvJPEG writes
    its output before the work queued on the caller's stream has run, and torch's caching
    allocator hands it blocks freed on that stream which queued kernels still read
    (pytorch/vision#9606): on an H100 the loss was NaN by the third step. Blocks freed on the
    idle decode stream are really free; the caller's stream waits for the result.
    """
    if device.type != "cuda":
        return _decode_batch(batch, device, size)
    index = device.index if device.index is not None else torch.cuda.current_device()
    side = _DECODE_STREAMS.setdefault(index, torch.cuda.Stream(device))
    side.synchronize()  # the last batch's decode and resize: its freed blocks are idle now
    with torch.cuda.stream(side):
        out, bad = _decode_batch(batch, device, size)
    caller = torch.cuda.current_stream(device)
    caller.wait_stream(side)
    out.record_stream(caller)  # not reused on the decode stream while the model reads it
    return out, bad


def _decode_batch(
    batch: EncodedBatch, device: torch.device, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(batch)
    out = torch.zeros((n, 3, size, size), dtype=torch.uint8, device=device)
    bad = torch.zeros(n, dtype=torch.bool)
    meta = batch.meta.tolist()
    payloads = batch.payloads()
    jpegs = [i for i in range(n) if meta[i][0] == KIND_JPEG]
    for i in range(n):
        if meta[i][0] == KIND_DECODED:
            out[i] = payloads[i].view(3, size, size).to(device, non_blocking=True)
    decoded: list[torch.Tensor | None]
    try:
        decoded = list(
            decode_jpeg([payloads[i] for i in jpegs], mode=ImageReadMode.RGB, device=device)
        )
    except RuntimeError:
        decoded = [_decode_one(payloads[i], device) for i in jpegs]
    for i, img in zip(jpegs, decoded, strict=True):
        if img is None:
            bad[i] = True
            continue
        _, left, top, right, bottom, flip, _ = meta[i]
        out[i] = crop_resize(img, (left, top, right, bottom), bool(flip), size)
    return out, bad


def _decode_one(data: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    for where in (device, torch.device("cpu")):
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=where).to(device)
        except RuntimeError:
            continue
    return None
