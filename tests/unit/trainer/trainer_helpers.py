"""Helpers to run the real trainer CLI (one process or torchrun) on tiny settings."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from time_bounds import within

TINY = ["--image-size", "32", "--batch-size", "2", "--workers", "0", "--log-every", "1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_env(**extra: str) -> dict[str, str]:
    """A clean environment: no outer torchrun or agent; heartbeats every 0.2 s."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env.pop("DDPFLEET_HEARTBEAT_DIR", None)
    return {**env, "DDPFLEET_HEARTBEAT_INTERVAL": "0.2", **extra}


def trainer_cmd(args: list[str], nproc: int = 1) -> list[str]:
    """``python -m trainer`` or a standalone torchrun with ``nproc`` gloo ranks."""
    if nproc == 1:
        return [sys.executable, "-m", "trainer", *args]
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
        "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", "trainer", *args,
    ]  # fmt: skip


def run_trainer(args: list[str], nproc: int = 1, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        trainer_cmd(args, nproc), env=trainer_env(), capture_output=True, text=True,
        timeout=within(timeout), check=False,
    )  # fmt: skip


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def read_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a TensorBoard log directory, read by TensorBoard's own reader (which
    applies a resumed writer's purge): {tag: [(step, value), ...]}."""
    acc = EventAccumulator(str(directory))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def wait_for_step(heartbeat: Path, step: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    """Until the rank's heartbeat file reports ``step`` (or the process ends, or time is up)."""
    deadline = time.time() + within(timeout)
    while time.time() < deadline and proc.poll() is None:
        if heartbeat.exists() and read_json(heartbeat)["step"] >= step:
            return
        time.sleep(0.2)


def tiny_mlp() -> torch.nn.Module:
    """A seeded two-layer float64 MLP: exact enough to compare gradients across ranks."""
    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)
    ).double()


def tiny_samples(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n seeded float64 samples of tiny_mlp's input, with labels of its 4 classes."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 4, (n,), generator=g)
