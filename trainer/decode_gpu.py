"""``--decode gpu``: the batch the loader workers send (JPEG bytes and each sample's plan) and
the rank's decode of it: one nvJPEG batch (``torchvision.io.decode_jpeg(list,
device="cuda")``), then the crop chain of trainer.crops on the GPU.

The workers only read the files and the JPEG header (size -> plan, trainer.data); a file
that is not a JPEG they decode themselves (trainer.decode) and send as its finished image.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Sequence

import torch
from torchvision.io import ImageReadMode, decode_jpeg

from trainer.crops import crop_resize

# torchvision 0.29 marks its image codecs deprecated in favour of TorchCodec (not in the image).
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities")

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
