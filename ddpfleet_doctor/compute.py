"""The doctor's compute check: training steps/s and img/s of the run's model (forward +
backward + SGD on synthetic data, after a few warm-up steps). On a GPU host one process per
GPU, all timed from the same moment, with nvidia-smi health (ddpfleet_doctor.gpuhealth) sampled
while they run.
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading
import time
import traceback

from ddpfleet_doctor import startline
from trainer.cpus import cpu_quota

CPU_BATCH, GPU_BATCH = 8, 256  # --batch-size 0: per process


def time_steps(step, warmup: int, seconds: float, max_steps: int, at_start=None) -> dict:
    """Run ``step`` ``warmup`` times (at most seconds / 2 of it, at least once), then
    ``at_start()`` (the start line: it returns what goes into the figures), then time it: at
    least 2 steps, until ``seconds`` have passed or ``max_steps`` ran."""
    start = time.perf_counter()
    for _ in range(max(1, warmup)):
        step()
        if time.perf_counter() - start >= seconds / 2:
            break
    line = {"start_line": at_start()} if at_start is not None else {}
    steps, start = 0, time.perf_counter()
    while True:
        step()
        steps += 1
        elapsed = time.perf_counter() - start
        if steps >= max_steps or (steps >= 2 and elapsed >= seconds):
            return {
                "steps": steps,
                "seconds": round(elapsed, 3),
                "steps_per_sec": steps / elapsed,
                **line,
            }


def measure(args, gpu: int | None, ready=None) -> dict:
    """Steps/s and img/s of forward + backward + SGD on synthetic data on one device."""
    import torch  # noqa: PLC0415 - storage and the tests of pure parts need no torch
    from torch import nn  # noqa: PLC0415

    from trainer.model import autocast, build_model, grad_scaler, resolve_amp  # noqa: PLC0415

    device = torch.device("cuda", gpu) if gpu is not None else torch.device("cpu")
    if gpu is not None:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    batch = args.batch_size or (GPU_BATCH if gpu is not None else CPU_BATCH)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = build_model(args.arch, 1000).to(device, memory_format=fmt).train()
    dtype = resolve_amp(args.amp, device)
    scaler = grad_scaler(device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, fused=gpu is not None)
    x = torch.randn(batch, 3, args.image_size, args.image_size, device=device).contiguous(
        memory_format=fmt
    )
    y = torch.randint(0, 1000, (batch,), device=device)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast(device, dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if gpu is not None:
            torch.cuda.synchronize(device)

    if ready is not None:  # every GPU's process starts timing at the same moment
        step()
        ready.wait(timeout=600)
    at_start = None
    if args.start_line:
        address, port, count = startline.parse(args.start_line)
        at_start = functools.partial(startline.wait, address, port, count, args.start_timeout)
    timed = time_steps(step, args.warmup, args.seconds, args.max_steps, at_start)
    amp = {torch.bfloat16: "bf16", torch.float16: "fp16", None: "off"}[dtype]
    return {
        "gpu": gpu,
        "batch_size": batch,
        "amp": amp,
        **timed,
        "steps_per_sec": round(timed["steps_per_sec"], 4),
        "images_per_sec": round(timed["steps_per_sec"] * batch, 2),
    }


def _gpu_worker(gpu: int, args, ready, results) -> None:
    try:
        results.put(measure(args, gpu, ready))
    except Exception as exc:  # reported by the parent as this GPU's failure
        ready.abort()
        results.put(
            {"gpu": gpu, "error": traceback.format_exception_only(type(exc), exc)[-1].strip()}
        )


def compute(args) -> dict:
    """This host's figures: one process on the CPU, or one per GPU (img/s summed, steps/s of
    the slowest GPU, which paces a DDP step)."""
    import torch  # noqa: PLC0415

    gpus = args.gpus if args.gpus >= 0 else torch.cuda.device_count()
    if args.start_line and args.serve_start_line:  # open until this check's process ends
        _, port, count = startline.parse(args.start_line)
        startline.serve(port, count, args.start_timeout)
    base = {
        "arch": args.arch,
        "image_size": args.image_size,
        "cpu_quota": cpu_quota(),
        "cpus_visible": os.cpu_count(),
    }
    if gpus == 0:
        one = measure(args, None)
        return {
            **base,
            "device": "cpu",
            "threads": torch.get_num_threads(),
            **one,
            "per_gpu": None,
            "gpu_health": None,
        }
    if not torch.cuda.is_available() or torch.cuda.device_count() < gpus:
        raise RuntimeError(
            f"{gpus} GPUs wanted, {torch.cuda.device_count()} visible in the container"
        )
    from ddpfleet_doctor import gpuhealth  # noqa: PLC0415

    ctx = torch.multiprocessing.get_context("spawn")
    ready, results = ctx.Barrier(gpus + 1), ctx.Queue()
    procs = [ctx.Process(target=_gpu_worker, args=(i, args, ready, results)) for i in range(gpus)]
    for p in procs:
        p.start()
    health = None
    try:
        ready.wait(timeout=600)
        time.sleep(min(args.seconds / 2, 5))  # sample clocks and links while every GPU is busy
        health = gpuhealth.sample()
    except threading.BrokenBarrierError:
        pass  # a GPU's process failed: its error comes through the queue
    except (ValueError, OSError, subprocess.SubprocessError) as exc:
        base["gpu_health_error"] = str(exc).splitlines()[0]  # the figures still count
    finally:
        per_gpu = sorted((results.get(timeout=900) for _ in procs), key=lambda r: r["gpu"])
        for p in procs:
            p.join()
    failed = [r for r in per_gpu if "error" in r]
    if failed:
        raise RuntimeError("; ".join(f"GPU {r['gpu']}: {r['error']}" for r in failed))
    return {
        **base,
        "device": "cuda",
        "batch_size": per_gpu[0]["batch_size"],
        "amp": per_gpu[0]["amp"],
        "images_per_sec": round(sum(r["images_per_sec"] for r in per_gpu), 2),
        "steps_per_sec": min(r["steps_per_sec"] for r in per_gpu),
        "per_gpu": per_gpu,
        "gpu_health": health,
    }
