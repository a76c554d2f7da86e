"""``--decode gpu`` on a real GPU: the same pixels as the CPU path, no memory written that
queued kernels still read, and a training run on nvJPEG batches whose loss stays finite.

``make test-gpu`` (bench/README.md says what each has shown on which GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from trainer.__main__ import main as trainer_main
from trainer.data import FolderImages
from trainer.decode_gpu import collate_encoded, decode_batch
from trainer.make_dataset import write_dataset

CUDA = torch.device("cuda", 0)
SIZE = 224


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jpeg500")
    write_dataset(root, classes=4, train_per_class=32, val_per_class=8, size=500)
    return root


@pytest.fixture(scope="module")
def gradients(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Smooth JPEGs, landscape and portrait: red grows to the right, green downwards, blue
    with both. Decoders agree on smooth content (on make_dataset's pixel noise nvJPEG's
    chroma upsampling and libjpeg-turbo's differ by several levels), and a wrong crop, flip,
    transposition or channel order is off by tens of levels."""
    root = tmp_path_factory.mktemp("gradients")
    for i, (w, h) in enumerate([(500, 375), (375, 500), (500, 333), (333, 500)] * 8):
        x, y = torch.linspace(0, 1, w).view(1, w), torch.linspace(0, 1, h).view(h, 1)
        rgb = torch.stack([30 + 200 * x + 0 * y, 30 + 200 * y + 0 * x, 20 + 100 * (x + y)])
        folder = root / "train" / f"class_{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rgb.round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
        Image.fromarray(pixels).save(folder / f"{i:03d}.jpg", quality=95)
    return root


def test_gpu_batch_shows_the_pixels_the_cpu_path_shows(gradients: Path) -> None:
    encoded = FolderImages(gradients / "train", SIZE, train=True, seed=3, encoded=True)
    plain = FolderImages(gradients / "train", SIZE, train=True, seed=3)
    keys = [(1, i) for i in range(len(plain))]
    gpu, bad = decode_batch(collate_encoded([encoded[k] for k in keys])[0], CUDA, SIZE)
    cpu = torch.stack([plain[k][0] for k in keys])
    assert not bad.any()
    diff = (gpu.cpu().int() - cpu.int()).abs().float()
    worst = diff.flatten(1).mean(1).max()
    assert worst < 1.5, f"mean |gpu - cpu| of the worst image: {worst:.2f} levels"
    assert (diff > 6).float().mean() < 0.001, f"{(diff > 6).float().mean():.4f} of pixels"


def test_decoding_leaves_memory_alone_that_queued_kernels_still_read(jpegs: Path) -> None:
    """pytorch/vision#9606: tensors freed on the caller's stream while kernels that read them
    are still queued; the decoder must not be handed (and overwrite) their blocks."""
    encoded = FolderImages(jpegs / "train", SIZE, train=True, seed=0, encoded=True)
    batch = collate_encoded([encoded[(0, i)] for i in range(64)])[0]
    wrong = 0
    for value in range(1, 9):
        blocks = [torch.full((500 * 500 * 3,), value, dtype=torch.uint8, device=CUDA)]
        blocks += [torch.full_like(blocks[0], value) for _ in range(63)]
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time ahead of the sums
        sums = torch.stack([b.sum(dtype=torch.int64) for b in blocks])
        del blocks  # freed on the caller's stream; the sums above have not run yet
        decode_batch(batch, CUDA, SIZE)
        torch.cuda.synchronize()
        wrong += int((sums != value * 500 * 500 * 3).sum())
    assert wrong == 0, f"{wrong} of 512 sums read memory the decoder had overwritten"


def test_training_on_gpu_decoded_batches_stays_finite(jpegs: Path, tmp_path: Path) -> None:
    args = ["--data-dir", str(jpegs), "--num-classes", "4", "--image-size", str(SIZE)]
    args += ["--batch-size", "32", "--epochs", "4", "--workers", "4", "--decode", "gpu"]
    args += ["--log-every", "2", "--output-dir", str(tmp_path), "--resume", "never"]
    assert trainer_main(args) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["decode"], summary["steps"]) == ("completed", "gpu", 16)
    assert summary["final_accuracy"] is not None
