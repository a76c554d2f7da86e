"""Naive DDP loop vs the trainer: same machine, threads, model and synthetic data.

    .venv/bin/python bench/ddp_bench.py                      # CPU: 112 px, batch 16, 2 threads
    .venv/bin/python bench/ddp_bench.py --device cuda --image-size 224 --batch-size 256

Both measurements are real DDP (gloo on CPU, nccl on CUDA) with ``--nproc`` ranks started
by torch.multiprocessing, and both count images per second of wall time over the steps
after ``--warmup`` (data loading included):

(a) naive: torchvision resnet50, fp32, NCHW, a plain DataLoader whose dataset returns
    float tensors normalised on the CPU, ``zero_grad()``, default DDP;
(b) trainer: ``python -m trainer --synthetic`` with its defaults (``--amp auto``,
    channels_last, uint8 batches normalised on the device, ...).

``--data-dir DIR`` (a JPEG ImageFolder) feeds both from files instead: (a) the textbook
torchvision pipeline (PIL decode, RandomResizedCrop, flip, ToTensor, Normalize in
``--workers`` loader processes), (b) the trainer with ``--decode auto``.

The synthetic images are the trainer's own SyntheticImages bank in both cases.
Prints both figures and the ratio; ``--json FILE`` also writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision import transforms as T
from torchvision.datasets import ImageFolder

from trainer.data import MEAN, STD, SyntheticImages


class NaiveImages(Dataset):
    """The same bank, the textbook way: float CHW normalised per sample on the CPU."""

    def __init__(self, bank: SyntheticImages):
        self.bank = bank
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.bank)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img, label = self.bank[i]
        return (img.float() / 255 - self.mean) / self.std, label


def _setup(rank: int, a: argparse.Namespace) -> torch.device:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.nproc))
    torch.set_num_threads(a.threads)
    if a.device == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _stage(rank: int, began: float, what: str) -> None:
    """One stderr line per start-up stage of the naive loop, so a slow start shows where."""
    if rank == 0:
        took = time.perf_counter() - began
        sys.stderr.write(f"ddp_bench: naive rank 0: {what} at {took:.1f} s\n")


def naive_worker(rank: int, a: argparse.Namespace, results: dict) -> None:
    began = time.perf_counter()
    device = _setup(rank, a)
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo", rank=rank, world_size=a.nproc)
    _stage(rank, began, "process group up")
    if a.data_dir:  # the textbook JPEG pipeline: PIL in the loader workers, float tensors
        tf = T.Compose([T.RandomResizedCrop(a.image_size), T.RandomHorizontalFlip(), T.ToTensor()])
        tf = T.Compose([tf, T.Normalize(MEAN, STD)])
        data = ImageFolder(str(Path(a.data_dir) / "train"), transform=tf)
    else:
        data = NaiveImages(SyntheticImages(a.samples, a.num_classes, a.image_size, seed=0))
    loader = DataLoader(
        data,
        batch_size=a.batch_size,
        sampler=DistributedSampler(data),
        drop_last=True,
        num_workers=a.workers,
        # forked, as under torchrun: this rank was spawned, and spawned workers start one by
        # one (82 s to the first batch with 8 workers on the H200; see trainer.data)
        multiprocessing_context="fork" if a.workers else None,
    )
    model = torchvision.models.resnet50(num_classes=a.num_classes).to(device)
    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[rank] if a.device == "cuda" else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    _stage(rank, began, f"{len(data)} samples, model on {device}")
    step, images, start = 0, 0, 0.0
    while step < a.steps:
        for batch, labels in loader:
            if step in (0, a.warmup):
                _stage(rank, began, f"batch of step {step + 1} loaded")
            x, y = batch.to(device), labels.to(device)
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == a.warmup:
                start = time.perf_counter()
            elif step > a.warmup:
                images += len(y)
            if step >= a.steps:
                break
    if a.device == "cuda":
        torch.cuda.synchronize()
    results[rank] = images / (time.perf_counter() - start)
    dist.destroy_process_group()


def trainer_worker(rank: int, a: argparse.Namespace, out: str, results: dict) -> None:
    _setup(rank, a)
    from trainer.__main__ import main  # noqa: PLC0415 - import after threads are set

    args = ["--synthetic", "--synthetic-size", str(a.samples), "--num-classes", str(a.num_classes)]
    if a.data_dir:
        args = ["--data-dir", a.data_dir, "--num-classes", str(a.num_classes)]
    args += ["--image-size", str(a.image_size), "--batch-size", str(a.batch_size)]
    args += ["--max-steps", str(a.steps), "--throughput-warmup", str(a.warmup)]
    args += ["--workers", str(a.workers), "--log-every", str(a.steps), "--output-dir", out]
    args += ["--resume", "never", *a.trainer_args]
    results[rank] = main(args)


def _spawn(fn: object, a: argparse.Namespace, *extra: object) -> dict:
    os.environ.update(MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS=str(a.threads))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(fn, args=(a, *extra, results), nprocs=a.nproc, join=True)
        return dict(results)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--nproc", type=int, default=1, help="DDP ranks for each measurement")
    p.add_argument("--image-size", type=int, default=112)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--warmup", type=int, default=4, help="first steps not timed")
    p.add_argument("--threads", type=int, default=2, help="torch threads per rank")
    p.add_argument("--workers", type=int, default=0, help="loader workers per rank (both)")
    p.add_argument(
        "--data-dir", help="JPEG ImageFolder (train/) instead of synthetic tensors, for both loops"
    )
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("trainer_args", nargs="*", help="extra trainer options after --")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.stderr.write("ddp_bench: error: --device cuda: no CUDA device\n")
        return 2
    if a.steps <= a.warmup:
        sys.stderr.write("ddp_bench: error: --steps must exceed --warmup\n")
        return 2
    naive = sum(_spawn(naive_worker, a).values())
    with tempfile.TemporaryDirectory() as out:
        codes = _spawn(trainer_worker, a, out)
        if any(codes.values()):
            sys.stderr.write(f"ddp_bench: error: trainer exit codes {codes}\n")
            return 1
        summary = json.loads((Path(out) / "summary.json").read_text())
    fast = summary["images_per_sec"]
    result = {
        "device": a.device, "nproc": a.nproc, "threads": a.threads, "image_size": a.image_size,
        "batch_size": a.batch_size, "steps": a.steps, "warmup": a.warmup,
        "naive_images_per_sec": round(naive, 2), "trainer_images_per_sec": fast,
        "trainer_amp": summary["amp"], "ratio": round(fast / naive, 3),
        "input": a.data_dir or "synthetic", "trainer_decode": summary.get("decode"),
    }  # fmt: skip
    sys.stdout.write(
        f"naive DDP loop: {naive:.1f} img/s\ntrainer:        {fast:.1f} img/s "
        f"(amp {summary['amp']})\nratio:          {fast / naive:.2f}x\n"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
