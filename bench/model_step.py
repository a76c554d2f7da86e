"""The bare ResNet-50 train step in each precision and layout: the ceiling for ddp_bench.

    .venv/bin/python bench/model_step.py          # CPU: 112 px, batch 16, 2 threads

No data pipeline, no DDP: forward, backward and an SGD step on one random batch, timed
separately after ``--warmup`` steps. The ratio of the last row to the first is the most
that bf16 + channels_last can give over the naive loop's fp32 NCHW on this machine.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torchvision

CONFIGS = [("fp32, NCHW", False, None), ("fp32, channels_last", True, None)]
CONFIGS += [("bf16 autocast, channels_last", True, torch.bfloat16)]


def measure(a: argparse.Namespace, channels_last: bool, dtype: torch.dtype | None) -> list[float]:
    """Seconds per step for forward, backward and the optimizer step (means)."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = torchvision.models.resnet50(num_classes=1000).to(a.device, memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch_size, 3, a.image_size, a.image_size, device=a.device)
    x = x.contiguous(memory_format=fmt)
    y = torch.randint(0, 1000, (a.batch_size,), device=a.device)
    sums = [0.0, 0.0, 0.0]

    def mark() -> float:
        if a.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    for i in range(a.warmup + a.steps):
        t0 = mark()
        with torch.autocast(a.device, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        t1 = mark()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = mark()
        opt.step()
        t3 = mark()
        if i >= a.warmup:
            for k, dt in enumerate((t1 - t0, t2 - t1, t3 - t2)):
                sums[k] += dt
    return [s / a.steps for s in sums]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--image-size", type=int, default=112)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    rates = []
    sys.stdout.write("config                          img/s  forward  backward  optimizer\n")
    for name, channels_last, dtype in CONFIGS:
        fwd, bwd, opt = measure(a, channels_last, dtype)
        rates.append(a.batch_size / (fwd + bwd + opt))
        ms = " ".join(f"{t * 1e3:6.0f} ms" for t in (fwd, bwd, opt))
        sys.stdout.write(f"{name:30s} {rates[-1]:6.1f} {ms}\n")
    sys.stdout.write(f"ceiling (last / first): {rates[-1] / rates[0]:.2f}x\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
