"""Prove that a host's GPUs can train: CUDA initialises on each, every GPU's compute capability
is supported, and a real NCCL all-reduce across all of them returns the right sum.

train.yml's preflight runs it in the training image, with the run's GPUs::

    python -m trainer.gpucheck --host node1 --gpus 8 --min-capability 7.5

One line on stdout and exit 0 when all is well; else one line naming the host and the CUDA or
NCCL error, exit 1. ``--device cpu --backend gloo`` runs the same all-reduce between CPU
processes (for tests on machines without GPUs).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ELEMENTS = 1 << 20  # 4 MiB of float32 per rank: big enough for NCCL's ring/tree, not for memory


def capability_problems(caps: list[tuple[int, int]], minimum: tuple[int, int]) -> list[str]:
    """'GPU i has compute capability x.y, below 7.5' for each GPU the image's CUDA cannot run."""
    return [
        f"GPU {i} has compute capability {c[0]}.{c[1]}, below {minimum[0]}.{minimum[1]}"
        for i, c in enumerate(caps)
        if tuple(c) < tuple(minimum)
    ]


def sum_problem(values: torch.Tensor, world: int) -> str | None:
    """The all-reduce of (rank + 1) over ``world`` ranks must be world * (world + 1) / 2."""
    want = world * (world + 1) / 2
    if bool((values == want).all()):
        return None
    return f"all-reduce returned {values.min().item()}..{values.max().item()}, expected {want}"


def _rank(rank: int, job: tuple[int, str, str, str], out: dict) -> None:
    world, init, backend, device_type = job
    try:
        device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
        if device_type == "cuda":
            torch.cuda.set_device(device)
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(
            backend,
            init_method=init,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=60),
            **kwargs,
        )
        t = torch.full((ELEMENTS,), float(rank + 1), device=device)
        dist.all_reduce(t)
        if device_type == "cuda":
            torch.cuda.synchronize(device)
        out[rank] = sum_problem(t, world)
        dist.destroy_process_group()
    except Exception as exc:  # anything CUDA/NCCL raises: reported as this rank's line
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        out[rank] = f"{device_type}:{rank}: {last.splitlines()[0]}"


def check(gpus: int, backend: str, device_type: str, minimum: tuple[int, int]) -> list[str]:
    """Problems found (empty: the GPUs and the all-reduce work)."""
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return ["CUDA is not available (driver, container toolkit, or no GPU given)"]
        found = torch.cuda.device_count()
        if found < gpus:
            return [f"{found} GPUs visible in the container, {gpus} wanted"]
        caps = [torch.cuda.get_device_capability(i) for i in range(gpus)]
        problems = capability_problems(caps, minimum)
        if problems:
            return problems
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.spawn(_rank, args=((gpus, init, backend, device_type), out), nprocs=gpus, join=True)
        return [out.get(r, f"rank {r} reported nothing") for r in range(gpus) if out.get(r, "?")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trainer.gpucheck", description=__doc__.splitlines()[0])
    p.add_argument("--host", default=os.uname().nodename, help="named in the result line")
    p.add_argument("--gpus", type=int, required=True, help="GPUs (ranks) to check, from 0")
    p.add_argument("--min-capability", default="7.5", help="lowest compute capability allowed")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    a = p.parse_args(argv)
    try:
        minimum = tuple(int(x) for x in a.min_capability.split("."))
        if a.gpus < 1 or len(minimum) != 2:
            raise ValueError
    except ValueError:
        sys.stderr.write("trainer.gpucheck: error: need --gpus >= 1 and --min-capability X.Y\n")
        return 2
    problems = check(a.gpus, a.backend, a.device, minimum)  # type: ignore[arg-type]
    if problems:
        sys.stdout.write(f"gpucheck failed on {a.host}: {'; '.join(problems)}\n")
        return 1
    what = f"{a.backend} all-reduce across {a.gpus} {'GPUs' if a.device == 'cuda' else 'ranks'}"
    sys.stdout.write(f"gpucheck ok on {a.host}: {what}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
